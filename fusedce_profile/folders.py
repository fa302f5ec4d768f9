"""The run folder: a new time-stamped one by default, never overwritten silently, locked while a
command writes into it.

- :func:`prepare_out_dir`: create or check the folder of ``out`` / ``force`` / ``resume`` (never a
  link, never inside another run's folder);
- :func:`run_folder`: the same, locked for the ``with`` block (a second run into it is refused);
- :func:`held_for_report`: a finished folder locked while its report is rebuilt (a live run's is refused);
- :func:`os_errors`: an OS error or a refused file of the folder as one line (``UsageError``).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.confined import FOLDER_LINK_REFUSED, FolderRefused
from fusedce_profiler.instrument.interruption import INTERRUPTED_FILE
from fusedce_profiler.instrument.runlock import live_holder
from fusedce_profiler.instrument.kinds import MEASURED_RECORDS, RUN_RECORDS, a_kind, enclosing_run, other_kind

# What a run writes into its folder; ``--force`` removes these and nothing else.
RUN_ARTEFACTS = RUN_RECORDS + ("results.csv", "summary.md", "report.html", store.PLOTS_DIR, store.SNAPSHOTS_DIR,
                               store.LOGS_DIR)


FIRST_RECORDS = (store.ENVIRONMENT_FILE, store.PLAN_FILE, store.MODEL_PLAN_FILE, INTERRUPTED_FILE)
"""The records a run writes before it measures anything: every command stores its environment as it starts
(the recorder with its first step), a grid and a model run their plans."""


def _not_a_run_folder(folder: Path) -> list[str]:
    """What ``folder`` holds when it holds no run's record, else ``[]``: ``--force`` and ``--resume``
    touch only a run's folder (``--out ~ --force`` would remove the home folder's ``logs/`` and
    ``plots/``; your own files beside a run are kept). A run's record is one of :data:`FIRST_RECORDS`
    that reads as the one this tool writes: a name alone proves nothing (a project's own
    ``environment.json``, ``plan.json`` or ``results.jsonl``)."""
    names = sorted(p.name for p in folder.iterdir())
    return [] if any(name in FIRST_RECORDS and _written_by_a_run(folder, name) for name in names) else names


def _written_by_a_run(folder: Path, name: str) -> bool:
    """Whether ``folder/name`` (one of :data:`FIRST_RECORDS`) reads as the record this tool writes under
    that name: its reader takes it (the plan's items, the environment's keys, the mark's fields)."""
    from fusedce_profiler.grid.plan import planned_cells
    from fusedce_profiler.instrument.interruption import read_interruption

    try:
        if name == store.PLAN_FILE:
            return planned_cells(folder) is not None
        if name == INTERRUPTED_FILE:
            return read_interruption(folder) is not None
        if name == store.MODEL_PLAN_FILE:  # these two readers import torch: only for a folder that needs them
            from fusedce_profiler.instrument.step.plan import planned_jobs

            return planned_jobs(folder) is not None
        from fusedce_profiler.instrument.environment import is_stored_environment

        return is_stored_environment(store.read_json(folder / name))
    except (ValueError, OSError, FolderRefused):
        return False


def _refuse_runs_below(out: Path) -> None:
    """:class:`OutputDirError` when a folder among ``out``'s artefacts that ``--force`` would remove
    (``plots/``, ``logs/``, ``snapshots/``) is another run's: a live run holds its lock, or it holds
    that run's records (:data:`MEASURED_RECORDS`; one nested while ``out`` held no result yet, say a
    grid cut before its first cell, was accepted, and ``--force`` removed it without a word)."""
    for name in RUN_ARTEFACTS:
        top = out / name
        if top.is_symlink() or not top.is_dir():
            continue
        for folder, _, files in os.walk(top):  # links are not followed
            holder = live_holder(folder) if store.LOCK_FILE in files else None
            if holder is not None:
                raise OutputDirError(f"--out {out}: --force would remove {folder}, "
                                     f"the folder of a run still live ({holder}); nothing removed")
            records = sorted(set(files) & set(MEASURED_RECORDS))
            if records:
                raise OutputDirError(f"--out {out}: --force would remove {folder}, the folder of another run (it "
                                     f"holds {records[0]}); move it out first; nothing removed")


class OutputDirError(UsageError):
    """The output folder cannot be used as asked (exit code 2)."""


def refuse_linked_out(out: Path) -> None:
    """:class:`OutputDirError` when ``out`` is a symbolic link: a run writes into (and ``--force``
    empties) the folder named, never a link's target; checked before anything is locked or removed."""
    if os.path.islink(out):
        raise OutputDirError(f"--out {out}: {FOLDER_LINK_REFUSED}")


def default_out_dir(now: dt.datetime | None = None, parent: Path | None = None) -> Path:
    """``./fusedce-profile-YYYYmmdd-HHMMSS`` (``-2``, ``-3`` … if that exists already)."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = (parent or Path.cwd()) / f"fusedce-profile-{stamp}"
    candidate, n = base, 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate


def prepare_out_dir(out: Path | None, *, force: bool, resume: bool,
                    lock: Callable[[Path], None] | None = None, resume_option: bool = True,
                    kind: str | None = None) -> Path:
    """Create (or check) the folder a run writes into and return it.

    - ``out`` is ``None``: a new time-stamped folder (``--resume`` needs an explicit one).
    - an existing non-empty folder: ``--resume`` continues the run in it; ``--force``
      removes the previous run's artefacts (:data:`RUN_ARTEFACTS`, nothing else); a folder
      that holds none of :data:`FIRST_RECORDS` as this tool writes them is no run folder and is
      refused with either, and ``--resume`` of a ``kind`` of run
      (:data:`~fusedce_profiler.instrument.kinds.KIND_RECORDS`) refuses another kind's folder;
      otherwise :class:`OutputDirError` (which names ``--resume`` only when ``resume_option``: the
      command has it). A folder holding only a lock file counts as empty.
    - ``lock`` is called with the folder once it exists and before anything in it is
      removed (the caller takes the folder's :class:`~fusedce_profiler.instrument.store.RunLock` there, so
      that ``--force`` never removes the files of a run still writing them).

    ``OSError`` (a folder that cannot be created or written) propagates.
    """
    from fusedce_profile import arguments

    if all(arguments.folder_flags(force, resume)):
        raise OutputDirError("--force and --resume contradict each other: choose one")
    resume_hint = " or --resume to continue it" if resume_option else ""
    if out is None:
        if resume:
            raise OutputDirError("--resume needs --out DIR: the folder of the run to continue")
        out = default_out_dir()
    out = Path(out)
    refuse_linked_out(out)  # before anything is locked or removed: --force would empty its target
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out}: exists and is not a folder")
    outer = enclosing_run(out)
    if outer is not None:
        raise OutputDirError(f"--out {out}: inside the folder of another run ({outer[0]}, "
                             f"which holds {outer[1]}); a run folder holds one run: choose a folder outside it")
    if out.is_dir() and any(p.name != store.LOCK_FILE for p in out.iterdir()):
        foreign = [name for name in _not_a_run_folder(out) if name != store.LOCK_FILE]
        if foreign:  # no option would let a run into it: say so, not "pass --force"
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            flags = "--force, --resume" if resume_option else "--force"
            raise OutputDirError(f"--out {out}: not a run folder (it holds {shown}, and no run's record); "
                                 f"a run writes only into a new or empty folder, or one a run wrote ({flags}): "
                                 "choose a new or empty folder")
        if not resume and not force:
            raise OutputDirError(f"--out {out}: the folder is not empty; pass --force to replace its "
                                 f"previous run{resume_hint}")
        other = other_kind(out, kind) if resume and kind else None
        if other:
            raise OutputDirError(f"--out {out}: the folder of {a_kind(other[0])} run ({other[1]}); --resume continues "
                                 f"{a_kind(kind)} run: give its folder, or a new one")
        if lock is not None:
            lock(out)
        if resume:
            return out
        _refuse_runs_below(out)
        # the records last: a removal that fails leaves a folder its report still reads
        for name in sorted(RUN_ARTEFACTS, key=lambda name: name in RUN_RECORDS):
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, onerror=_raise_naming_the_path)
            elif os.path.lexists(path):
                path.unlink()  # a file, a pipe, a link (removed, never followed): whatever holds the name
        return out
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    if lock is not None:
        try:
            lock(out)
        except store.FolderInUse:  # another run's, made meanwhile: left alone
            raise
        except OSError:  # a full disk at the lock: no empty folder left behind, one more at each retry
            if made:
                with contextlib.suppress(OSError):
                    if os.path.getsize(out / store.LOCK_FILE) == 0:  # the lock this call began, unwritten
                        (out / store.LOCK_FILE).unlink()
                with contextlib.suppress(OSError):
                    out.rmdir()  # only when empty
            raise
    return out


def _raise_naming_the_path(function, path: str, exc_info) -> None:
    """``shutil.rmtree``'s error handler: the error names the whole path (its own names only the entry)."""
    exc = exc_info[1]
    if isinstance(exc, OSError):
        exc.filename = path
    raise exc


def describe_os_error(exc: OSError) -> str:
    """``PATH: strerror`` (the path the OS error names, else the message). A rename names the file
    it was to replace (a report's page that is a folder), not the temporary it came from. The system
    out of descriptors or memory is said as the limit to raise, whatever file it was opening (a
    library's module, as often as the folder's)."""
    from fusedce_profiler.instrument.worker_errors import refused_resource

    refused = refused_resource(exc)
    if refused is not None:
        return refused
    path = exc.filename2 or exc.filename or ""
    reason = exc.strerror or str(exc)
    return f"{path}: {reason}" if path else reason


@contextlib.contextmanager
def os_errors(what: str = "") -> Iterator[None]:
    """An ``OSError`` inside becomes a :class:`~fusedce_profile.errors.UsageError` naming the path
    and the OS error (``what``: the argument it concerns, e.g. ``--out``); so does a run-folder file
    the tool refuses to read (:class:`~fusedce_profiler.instrument.confined.FolderRefused`: a link,
    a file over its size limit, JSON nested too deeply)."""
    prefix = f"{what} " if what else ""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"{prefix}{describe_os_error(exc)}") from None
    except FolderRefused as exc:
        raise UsageError(f"{prefix}{exc}") from None


def check_appendable(path: Path) -> None:
    """``OSError`` naming ``path`` when it exists but could not be appended to in place (a link, a
    hard link, a named pipe: :func:`~fusedce_profiler.instrument.confined.open_own_file`; a file
    this user may not write). Nothing is written: a resumed run checks the file it will append to
    before it changes anything else in the folder."""
    from fusedce_profiler.instrument import confined

    if os.path.lexists(path):
        os.close(confined.open_own_file(path, os.O_WRONLY | os.O_APPEND, path))


@contextlib.contextmanager
def report_errors(out_dir: Path, kept: str, mend: str | None = None) -> Iterator[None]:
    """:func:`os_errors` for writing a run's report once its results are stored (``kept``: what
    they are, "the finished cells"): the one line also says they are kept and what makes the report
    once the cause (a full disk, a page that is a folder) is mended: ``mend``, by default
    "`fusedce-profile report DIR` writes the report"."""
    from fusedce_profiler.instrument.text import one_line, shell_word

    try:
        with os_errors():
            yield
    except UsageError as failed:
        folder = one_line(out_dir)
        mend = mend or f"`fusedce-profile report {shell_word(out_dir)}` writes the report"
        raise UsageError(f"{failed}; {kept} are kept in {folder}: {mend} once that is mended") from None


def locking_into(held: list) -> Callable[[Path], None]:
    """A ``lock`` for :func:`prepare_out_dir`: takes the folder's run lock and appends it to ``held``
    (a folder another run holds raises :class:`OutputDirError` naming the holder)."""
    def lock(folder: Path) -> None:
        try:
            held.append(store.RunLock(folder).acquire())
        except store.FolderInUse as exc:
            raise OutputDirError(str(exc)) from None

    return lock


@contextlib.contextmanager
def held_for_report(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s run lock for the ``with`` block, so that a report never reads (and
    rewrites) a folder a live run is writing; such a folder raises
    :class:`~fusedce_profile.errors.UsageError` naming the holder."""
    try:
        with os_errors():
            lock = store.RunLock(run_dir).acquire()
    except store.FolderInUse as exc:
        raise in_use_for_report(exc.folder, exc.holder) from None
    try:
        yield
    finally:
        lock.release()


def in_use_for_report(folder: Path, holder: str) -> UsageError:
    """The refusal of a report of ``folder``, which the live run ``holder`` is writing."""
    return UsageError(f"{folder} is in use by {holder}: a run is still writing into it; report it once that run "
                      "has finished")


@contextlib.contextmanager
def run_folder(out: str | Path | None, *, force: bool = False, resume: bool = False,
               resume_option: bool = True, kind: str | None = None) -> Iterator[Path]:
    """The folder of :func:`prepare_out_dir`, locked (:class:`~fusedce_profiler.instrument.store.RunLock`)
    for the ``with`` block; a folder another run holds, a bad combination and a folder that cannot be
    created raise :class:`~fusedce_profile.errors.UsageError`."""
    locks: list = []
    try:
        with os_errors("--out"):
            folder = prepare_out_dir(None if out is None else Path(out), force=force, resume=resume,
                                     lock=locking_into(locks), resume_option=resume_option, kind=kind)
        yield folder
    finally:
        for held in locks:
            held.release()
