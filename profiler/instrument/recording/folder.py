"""The folder a :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder` records into.

:func:`take_folder` checks and locks it before the first step: never a symbolic link (nor its
``snapshots/``, which replacing a recording empties), never another kind of run's folder (whose
summary and environment a recording would replace) nor a folder inside a run's (whose ``--force``
would remove it), a recording already there replaced only
with ``force`` and added to only with ``append``.

Public API: :func:`absolute_folder`, :func:`take_folder`, :class:`RecordingExists`, :func:`save_environment_once`
(the environment block, written with the first step recorded).
"""
from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

from fusedce_profiler.instrument import confined, store
from fusedce_profiler.instrument.confined import FolderRefused, refuse_linked_folder
from fusedce_profiler.instrument.kinds import a_kind, enclosing_run, other_kind


class RecordingExists(FileExistsError):
    """The folder holds a recording, and neither ``force`` nor ``append`` was given (the tool's own refusal,
    never a program's ``FileExistsError`` that a signal handler raised meanwhile)."""


def absolute_folder(out: str | os.PathLike) -> tuple[Path, OSError | None]:
    """``out`` made absolute, once (a later change of the current folder moves nothing), and None; for a
    relative ``out`` in a process whose current folder was removed, ``out`` as given and the error saying
    so (the recorder then records nothing, with a warning)."""
    try:
        return Path(os.path.abspath(out)), None
    except OSError as exc:
        return Path(out), exc


def _refuse_unless_a_recording(steps: Path) -> None:
    """:class:`FolderRefused` naming ``steps`` when it is there but no recording could be: a link,
    a file with another name (a hard link), a named pipe, a folder."""
    try:
        why = confined.not_own_file(os.lstat(steps))
    except FileNotFoundError:
        return
    if why is not None:
        raise FolderRefused(f"{steps}: {why}")


def _lock(out: Path) -> store.RunLock:
    """``out``'s exclusive lock. A recorder of this process dropped without ``close()`` releases its lock
    when it is collected (its finalizer); one that is garbage not yet collected gives way: refused
    by this process, the lock is tried once more after a collection."""
    try:
        return store.RunLock(out, exclusive=True).acquire()
    except store.FolderInUse:
        if not store.RunLock.held_here(out):
            raise
        gc.collect()
        return store.RunLock(out, exclusive=True).acquire()


def take_folder(out: Path, *, force: bool, append: bool, owner: object) -> store.RunLock:
    """Lock ``out`` for a recording and return its lock, released when ``owner`` (the recorder) is
    collected if not before; with ``force``, remove the recording it holds (its steps and their
    snapshots) once locked. A removal refused once locked releases the lock. Signals are the caller's to
    hold back (the recorder takes its folder within :func:`~fusedce_profiler.instrument.deferred_signals.deferred`,
    whose undo closes it).

    :class:`RecordingExists` (a ``FileExistsError``): ``out`` holds a recording and neither ``force`` nor
    ``append`` is given;
    :class:`~fusedce_profiler.instrument.confined.FolderRefused`: a linked folder or ``snapshots/``,
    or another kind of run's folder (refused before anything is locked or removed);
    :class:`~fusedce_profiler.instrument.store.FolderInUse` or ``OSError``: the lock cannot be taken.
    """
    refuse_linked_folder(out)
    other = other_kind(out, "recorded")
    if other is not None:
        raise FolderRefused(f"{out}: the folder of {a_kind(other[0])} run ({other[1]}); a recording "
                            "goes into a folder of its own")
    outer = enclosing_run(out)
    if outer is not None:
        raise FolderRefused(f"{out}: inside the folder of another run ({outer[0]}, which holds {outer[1]}; its "
                            "--force would remove the recording); a recording goes into a folder of its own")
    existing = out / store.RECORDED_STEPS_FILE
    _refuse_unless_a_recording(existing)
    recorded = os.path.lexists(existing)
    if recorded and not (force or append):
        raise RecordingExists(f"{out} already holds a recording ({store.RECORDED_STEPS_FILE}); "
                              "pass force=True to replace it, append=True to add to it, or another folder")
    snapshots = out / store.SNAPSHOTS_DIR
    if not (recorded and append):
        refuse_linked_folder(snapshots)
    lock = _lock(out)
    try:
        if recorded and not append and os.path.lexists(existing):
            _remove_recording(existing, snapshots)
        weakref.finalize(owner, lock.release)  # dropped without close(): released once collected
    except BaseException:
        lock.release()
        raise
    return lock


def _remove_recording(steps: Path, snapshots: Path) -> None:
    """Remove a recording's steps file and its snapshots (``force``); a link is removed, never followed."""
    steps.unlink()
    for old in snapshots.glob("step-*"):
        if old.is_symlink() or old.is_file():
            old.unlink()


def save_environment_once(out: Path, first: bool) -> None:
    """Write ``out``'s environment block with this session's ``first`` record, or where the folder has none."""
    from fusedce_profiler.instrument.environment import collect_environment, save_environment

    if first or not (out / store.ENVIRONMENT_FILE).is_file():
        save_environment(out, collect_environment())
