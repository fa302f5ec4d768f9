"""The run folder: a new time-stamped one by default, never overwritten silently."""
from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from pathlib import Path

from fusedce_profile.run_folder import default_out_dir  # noqa: F401 - the commands' default folder
from fusedce_profiler.instrument import store

# What a run writes into its folder; ``--force`` removes these and nothing else.
RUN_ARTEFACTS = (store.RESULTS_FILE, "results.csv", "summary.md", "report.html", store.ENVIRONMENT_FILE,
                 store.PLAN_FILE, store.MODEL_RESULTS_FILE, store.FIT_FILE, store.PARITY_FILE, store.DOCTOR_FILE,
                 "plots", store.SNAPSHOTS_DIR, store.LOGS_DIR)


class OutputDirError(ValueError):
    """The output folder cannot be used as asked (exit code 2)."""


def prepare_out_dir(out: Path | None, *, force: bool, resume: bool,
                    lock: Callable[[Path], None] | None = None) -> Path:
    """Create (or check) the folder a run writes into and return it.

    - ``out`` is ``None``: a new time-stamped folder (``--resume`` needs an explicit one).
    - an existing non-empty folder: ``--resume`` continues the run in it; ``--force``
      removes the previous run's artefacts (:data:`RUN_ARTEFACTS`, nothing else);
      otherwise :class:`OutputDirError`. A folder holding only a lock file counts as empty.
    - ``lock`` is called with the folder once it exists and before anything in it is
      removed (the caller takes the folder's :class:`~fusedce_profiler.instrument.store.RunLock` there, so
      that ``--force`` never removes the files of a run still writing them).

    ``OSError`` (a folder that cannot be created or written) propagates.
    """
    if force and resume:
        raise OutputDirError("--force and --resume contradict each other: choose one")
    if out is None:
        if resume:
            raise OutputDirError("--resume needs --out DIR: the folder of the run to continue")
        out = default_out_dir()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(p.name != store.LOCK_FILE for p in out.iterdir()):
        if not resume and not force:
            raise OutputDirError(f"--out {out}: the folder is not empty; pass --force to replace its "
                                 "previous run or --resume to continue it")
        if lock is not None:
            lock(out)
        if resume:
            return out
        for name in RUN_ARTEFACTS:
            path = out / name
            if path.is_symlink() or path.is_file():
                path.unlink()  # a link is removed, never followed
            elif path.is_dir():
                shutil.rmtree(path)
        return out
    out.mkdir(parents=True, exist_ok=True)
    if lock is not None:
        lock(out)
    return out
