"""Files written as one set: a folder's report is replaced whole, or not at all.

Every file :mod:`~fusedce_profiler.instrument.store` writes goes to a temporary name first and is
then renamed into place (:func:`place`). Inside :func:`all_or_nothing` the renames wait for the end
of the block: when it ends normally they are all done together, shielded from Ctrl-C, SIGTERM and SIGHUP
(a signal arriving meanwhile is taken right after them), and a file's temporaries that a process killed
outright left beside it are removed with it; when it ends by an exception — a signal,
a full disk — every temporary is removed instead, and the folder holds exactly what it held (so too
when one of the files' names is taken by a folder: that is found before any rename; a rename the
file system refuses for another reason, an immutable file or a mount point, is found only when it
is tried, and the files renamed before it stay in place). A
file the block removes (:func:`remove`) goes with the renames. Reading back a file written in the
block (the HTML page embeds the plots) finds its new content at :func:`newest`. A folder the block
creates (:func:`make_folder`, a first report's ``plots/``) is removed again when the block fails and
it is still empty.

Public API: :func:`all_or_nothing`, :func:`signals_held`, :class:`Placed`, :func:`place`, :func:`remove`,
:func:`make_folder`, :func:`newest`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, SIGTERM and SIGHUP (the terminal closed): the signals a command stops on."""


@dataclass
class Placed:
    """What an :func:`all_or_nothing` block wrote: ``written`` maps each file's path to the
    temporary holding its new content, ``removed`` holds the files to remove, ``made`` the folders
    the block created (outermost first); ``done`` turns true once all of them are in place."""

    written: dict[Path, str] = field(default_factory=dict)
    removed: set[Path] = field(default_factory=set)
    made: list[Path] = field(default_factory=list)
    done: bool = False


_open_set: ContextVar[Placed | None] = ContextVar("fusedce_staged_files", default=None)


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def make_folder(path: str | Path) -> None:
    """``mkdir -p path``; inside :func:`all_or_nothing`, each folder it creates is noted so that a
    block that fails leaves no empty folder behind."""
    path = Path(path)
    missing, folder = [], path
    while not folder.exists() and folder != folder.parent:  # up to the first folder that exists
        missing.insert(0, folder)
        folder = folder.parent
    path.mkdir(parents=True, exist_ok=True)
    placed = _open_set.get()
    if placed is not None:
        placed.made.extend(folder for folder in missing if folder not in placed.made)


def _abandon(placed: Placed) -> None:
    """Undo a failed block: its temporaries removed, the folders it created removed if empty."""
    for temporary in placed.written.values():
        _unlink(temporary)
    for folder in reversed(placed.made):
        try:
            os.rmdir(folder)
        except OSError:  # not empty (something else wrote into it), or gone
            pass


def place(temporary: str, path: str | Path) -> None:
    """Rename ``temporary`` to ``path``: now, or at the end of the enclosing :func:`all_or_nothing`
    block (a second write of the same path in the block replaces the first)."""
    placed, path = _open_set.get(), Path(path)
    if placed is None:
        os.replace(temporary, path)
        _remove_stale_temporaries([path])
        return
    earlier = placed.written.pop(path, None)
    if earlier is not None:
        _unlink(earlier)
    placed.removed.discard(path)
    placed.written[path] = temporary


def _remove_stale_temporaries(paths: Iterable[Path]) -> None:
    """Remove the temporaries of ``paths`` that earlier writes left beside them (``.NAME.XXXXXXXX.tmp``,
    the store's names: a process killed outright, ``kill -9``, never removed them), one listing of each
    folder. The folder's lock keeps any other writer out, so none of them is a write in progress."""
    names_in: dict[Path, set[str]] = {}
    for path in paths:
        names_in.setdefault(path.parent, set()).add(path.name)
    for folder, names in names_in.items():
        stale = re.compile(r"\.(?:" + "|".join(map(re.escape, names)) + r")\.[a-z0-9_]{8}\.tmp")
        try:
            found = [entry.name for entry in os.scandir(folder) if stale.fullmatch(entry.name)]
        except OSError:
            continue
        for name in found:
            try:
                os.unlink(folder / name)
            except OSError:  # gone meanwhile, or a folder of that name: not the store's
                pass


def remove(path: str | Path) -> None:
    """Remove the file ``path``: now, or at the end of the enclosing :func:`all_or_nothing` block."""
    placed, path = _open_set.get(), Path(path)
    if placed is None:
        _unlink(path)
        return
    earlier = placed.written.pop(path, None)
    if earlier is not None:
        _unlink(earlier)
    placed.removed.add(path)


def newest(path: str | Path) -> Path:
    """Where ``path``'s newest content is: the temporary it was written to in the enclosing
    :func:`all_or_nothing` block, else ``path`` itself."""
    placed, path = _open_set.get(), Path(path)
    if placed is not None and path in placed.written:
        return Path(placed.written[path])
    return path


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP received inside the block are taken when it ends, by the handlers that
    were in place before it (outside the main thread, where Python cannot set handlers, nothing
    is held: signals reach only the main thread's handlers anyway)."""
    received: list[int] = []
    try:
        previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                    for signum in _HELD_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


@contextlib.contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """The signals received inside the block whose handler stopped it (raised, e.g.
    ``KeyboardInterrupt``), in a list; each signal is still passed on at once to the handler in
    place before the block. Python drops an exception raised while it runs a callback it cannot
    propagate from — a weak reference's, a finaliser's, during garbage collection — and only prints
    "Exception ignored in …" (not printed for such a stop: the block's end reports it): the list is
    how the block's end still knows that it was stopped. A signal ignored before the block stays
    ignored; outside the main thread nothing is noted."""
    received: list[int] = []

    def noting(previous):
        def note(signum, frame) -> None:
            if not callable(previous):  # the default action, a stop of the process, as before
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
                return
            try:
                previous(signum, frame)
            except BaseException:
                received.append(signum)
                raise
        return note

    try:
        previous = {signum: signal.getsignal(signum) for signum in _HELD_SIGNALS}
        previous = {signum: handler for signum, handler in previous.items() if handler is not signal.SIG_IGN}
        for signum, handler in previous.items():
            signal.signal(signum, noting(handler))
    except ValueError:  # not the main thread
        yield received
        return
    printed = sys.unraisablehook

    def quiet(unraisable) -> None:  # the dropped stop is noted above: not "Exception ignored in …" on stderr
        if received and not isinstance(unraisable.exc_value, Exception):
            return
        printed(unraisable)

    sys.unraisablehook = quiet
    try:
        yield received
    finally:
        sys.unraisablehook = printed
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def all_or_nothing() -> Iterator[Placed]:
    """Within the block, files written through the store and removed through :func:`remove` take
    their place only when the block ends without an exception, all together; see the module. A block
    inside another joins it: its files take their place with the outer block's. As a decorator
    (``@all_or_nothing()``) each call of the function is such a block."""
    outer = _open_set.get()
    if outer is not None:
        yield outer
        return
    placed = Placed()
    token = _open_set.set(placed)
    with _signals_noted() as received:
        try:
            yield placed
        except BaseException:
            _abandon(placed)
            raise
        finally:
            _open_set.reset(token)
    if received:  # the signal's exception was dropped inside a callback: the block did not finish
        _abandon(placed)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)  # its handler's exception, raised where it propagates
        raise KeyboardInterrupt  # the handler stopped the block once: stopped all the same
    with signals_held():
        pending = list(placed.written.items())
        try:
            folders = [path for path, _ in pending if os.path.isdir(path) and not os.path.islink(path)]
            if folders:  # a rename onto a folder would fail after the others were done: none is done
                _abandon(placed)
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(folders[0]))
            while pending:
                path, temporary = pending[0]
                os.replace(temporary, path)
                pending.pop(0)
        except OSError:
            for _, temporary in pending:
                _unlink(temporary)
            raise
        _remove_stale_temporaries(placed.written)
        for path in placed.removed:
            _unlink(path)
        placed.done = True
