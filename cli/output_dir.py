"""The run folder: a new time-stamped one by default, never overwritten silently."""
from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

# What a run writes into its folder; ``--force`` removes these and nothing else.
RUN_ARTEFACTS = ("results.jsonl", "results.csv", "summary.md", "report.html", "environment.json",
                 "plots", "snapshots", "logs")


class OutputDirError(ValueError):
    """The output folder cannot be used as asked (exit code 2)."""


def default_out_dir(now: dt.datetime | None = None, parent: Path | None = None) -> Path:
    """``./fusedce-profile-YYYYmmdd-HHMMSS`` (``-2``, ``-3`` … if that exists already)."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = (parent or Path.cwd()) / f"fusedce-profile-{stamp}"
    candidate, n = base, 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate


def prepare_out_dir(out: Path | None, *, force: bool, resume: bool) -> Path:
    """Create (or check) the folder a run writes into and return it.

    - ``out`` is ``None``: a new time-stamped folder (``--resume`` needs an explicit one).
    - an existing non-empty folder: ``--resume`` continues the run in it; ``--force``
      removes the previous run's artefacts (:data:`RUN_ARTEFACTS`, nothing else);
      otherwise :class:`OutputDirError`.
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
    if out.is_dir() and any(out.iterdir()):
        if resume:
            return out
        if not force:
            raise OutputDirError(f"--out {out}: the folder is not empty; pass --force to replace its "
                                 "previous run or --resume to continue it")
        for name in RUN_ARTEFACTS:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out
