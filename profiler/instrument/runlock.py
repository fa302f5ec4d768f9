"""The lock a run holds on its folder while it writes into it (``.lock`` says who holds it).

Public API: :data:`LOCK_FILE`, :class:`RunLock`, :class:`FolderInUse`, :func:`live_holder` (re-exported by
:mod:`fusedce_profiler.instrument.store`, which describes the whole folder).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from pathlib import Path

from fusedce_profiler.instrument import confined, deferred_signals, folder_identity

LOCK_FILE = ".lock"


class FolderInUse(RuntimeError):
    """Another run holds the folder's lock: ``folder`` and ``holder`` (e.g. ``pid 12 since …``)."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is in use by {holder}; wait for it to finish or choose another --out")
        self.folder, self.holder = folder, holder


PROBES_WAIT_S = 1.0
"""How long a lock is waited for while only probes hold it (:func:`live_holder` takes it shared for a moment)."""


def _lock_exclusive(fd: int) -> bool:
    """Take the folder's lock on ``fd``; ``False`` when a run holds it. Refused while it can be taken shared, it
    is held only by probes: tried again for up to :data:`PROBES_WAIT_S`."""
    deadline = time.monotonic() + PROBES_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # held exclusively: a run
        fcntl.flock(fd, fcntl.LOCK_UN)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


_CHANGING = threading.RLock()
"""Held while a run lock is taken or released, and by a fork (:func:`os.register_at_fork`): a child
forked while another thread had the folder's descriptor open and locked but not yet recorded in
``RunLock._held`` (or no longer) would keep that lock, unseen by :func:`_forget_locks_in_child`, after the
parent released it. Re-entrant: a collection may release a dropped recorder's lock in the middle of a change."""


class RunLock:
    """An exclusive lock on a run folder while a run writes into it (``fcntl.flock`` on the folder).

    The lock is taken on the folder itself, so it needs no file and cannot be redirected by a
    link. While it is held, ``.lock`` says who holds it (the pid and since when: nothing about
    the host, the user or the command line, since a folder goes into bug reports), so a second
    run can name the holder; the holder removes it on release. The operating system releases
    the lock when the holder exits, however it exits, so a killed run never leaves the folder
    locked (its stale ``.lock`` note is rewritten by the next holder).

    Within one thread the lock is re-entrant: a command that locks its folder first (before
    ``--force`` removes anything) and the run it then starts share one lock, released when both
    released it. A call in another thread of the process (two API calls at once) is another run:
    refused as a second process is. An ``exclusive`` lock (a ``StepRecorder``'s, held across the
    user's own loop, between calls of anything in the same thread) is never re-entered, and never
    re-enters one this process holds.
    """

    _held: dict[Path, list] = {}  # resolved folder -> [folder fd, count, the thread that took it, exclusive]
    taken: list[Path] = []
    """Every folder this process has locked, in order (never emptied: a folder a process held is one
    it may have written into — what a command stopped by a signal names as kept)."""

    def __init__(self, folder: str | Path, exclusive: bool = False) -> None:
        self.folder, self.exclusive = Path(folder), exclusive
        self.path = self.folder / LOCK_FILE
        self._key: Path | None = None
        self._entry: list | None = None  # the _held entry it counts in: never another holder's of the folder

    def acquire(self) -> "RunLock":
        """Take the lock (re-entered within a thread, module docstring); signals that come meanwhile are
        delivered once it is taken and recorded, or given up (:mod:`.deferred_signals`)."""
        if self._key is not None:
            return self
        with deferred_signals.deferred(undo=self.release), _CHANGING:  # a signal's exception: the lock is not kept
            self._acquire()
        return self

    def _acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        key = self.folder.resolve()
        if key in RunLock._held:
            _, _, owner, exclusive = RunLock._held[key]
            if exclusive or self.exclusive:
                raise FolderInUse(self.folder, f"{self._holder()} (a recording open in this process)"
                                  if exclusive else f"{self._holder()} (a run of this process)")
            if owner is not threading.current_thread():  # the thread itself: a new one may reuse a dead one's id
                raise FolderInUse(self.folder, f"{self._holder()} (another thread of this process)")
            RunLock._held[key][1] += 1
            self._key, self._entry = key, RunLock._held[key]
            return
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        opened, noted, note = False, False, None
        try:  # whatever stops it before the lock is recorded (a full disk, Ctrl-C): no descriptor, lock or note stays
            if not _lock_exclusive(fd):
                raise FolderInUse(self.folder, self._holder())
            # a linked, hard-linked or piped note is refused, never written through or waited on
            note = confined.open_own_file(LOCK_FILE, os.O_WRONLY | os.O_CREAT, self.path, dir_fd=fd)
            opened = True
            os.ftruncate(note, 0)  # only once it is known to be the folder's own file
            os.write(note, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            written, note = note, None
            os.close(written)
            folder_identity.note_locked_folder(self.folder, fd)
            noted = True
            self._entry = RunLock._held[key] = [fd, 1, threading.current_thread(), self.exclusive]
            self._key = key
        except BaseException as exc:
            if self._entry is not None:  # recorded before it stopped: forgotten again
                RunLock._held.pop(key, None)
                self._key = self._entry = None
            if noted:
                folder_identity.note_locked_folder(self.folder, None)
            if note is not None:
                os.close(note)
            if opened:  # the folder's own note: none is left behind
                with contextlib.suppress(OSError):
                    os.unlink(LOCK_FILE, dir_fd=fd)
            os.close(fd)  # closing the folder releases the lock
            if isinstance(exc, OSError):
                exc.filename = str(self.path)  # opened relative to the folder: name the whole path
            raise
        RunLock.taken.append(self.folder)

    @staticmethod
    def held_here(folder: str | Path) -> bool:
        """Whether this process holds ``folder``'s lock (any thread of it)."""
        return Path(folder).resolve() in RunLock._held

    def _holder(self) -> str:
        from fusedce_profiler.instrument.text import shorten

        try:
            note = confined.read_bytes(self.path, limit=4096).decode("utf-8", "replace").strip()
        except (OSError, confined.FolderRefused):
            note = ""
        return shorten(note, 200) if note else "another process"

    def release(self) -> None:
        """Release one acquire (the lock itself with the last); signals are held back meanwhile. A signal
        that lands before they are (its handler raising before anything was released) goes on once the
        lock is released after all: a collected recorder's finalizer, which calls this, runs only once. Released
        already (a closed recorder's finalizer, run by a garbage collection anywhere): nothing is held back, so a
        signal landing meanwhile is not delivered inside the finalizer, where Python drops its exception."""
        if self._key is None:
            return
        try:
            with deferred_signals.deferred(), _CHANGING:
                self._release()
        except BaseException:
            if self._key is not None:  # stopped before anything was released: released now, then it goes on
                with deferred_signals.deferred(), _CHANGING:
                    self._release()
            raise

    def _release(self) -> None:
        entry = RunLock._held.get(self._key) if self._key is not None else None
        if entry is None or entry is not self._entry:  # not held, or held by the process this one was forked
            self._key = self._entry = None  # from (whose folder this process may have locked anew since)
            return
        entry[1] -= 1
        if entry[1] == 0:
            del RunLock._held[self._key]
            try:
                folder_identity.note_locked_folder(self.folder, None)
                with contextlib.suppress(OSError):
                    os.unlink(LOCK_FILE, dir_fd=entry[0])  # while still held: no one else wrote it
            finally:  # unlocked, not only closed: a child forked meanwhile shares the lock until it closes its copy
                with contextlib.suppress(OSError):
                    fcntl.flock(entry[0], fcntl.LOCK_UN)
                os.close(entry[0])
        self._key = self._entry = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def live_holder(folder: str | Path) -> str | None:
    """Who holds ``folder``'s run lock now (its ``.lock`` note, or ``"another process"``); ``None``
    when no run does. A lock this process holds counts. ``folder`` is not followed when it is a link."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:  # shared: two probes at once see no holder in each other; a run's exclusive lock refuses it
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return RunLock(folder)._holder()
    finally:
        os.close(fd)  # also ends this probe's own lock
    return None


def _after_fork_in_child() -> None:
    _CHANGING.release()
    _forget_locks_in_child()


def _forget_locks_in_child() -> None:
    """In a process forked while locks were held (a DataLoader worker forked during a recorded
    run): close its copies of the locked folders' descriptors. The lock lives as long as any copy
    is open, so the worker kept the folder locked after the recorder released it; the holder
    alone releases it now."""
    for fd, *_ in RunLock._held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    RunLock._held.clear()


os.register_at_fork(before=_CHANGING.acquire, after_in_parent=_CHANGING.release, after_in_child=_after_fork_in_child)

