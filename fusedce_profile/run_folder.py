"""The run folder a command writes when none is named."""
from __future__ import annotations

import datetime as dt
from pathlib import Path


def default_out_dir(now: dt.datetime | None = None, parent: Path | None = None) -> Path:
    """``./fusedce-profile-YYYYmmdd-HHMMSS`` (``-2``, ``-3`` … if that exists already)."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = (parent or Path.cwd()) / f"fusedce-profile-{stamp}"
    candidate, n = base, 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate
