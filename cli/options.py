"""Command-line options and their resolution, shared by every sub-command."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.output_dir import prepare_out_dir
from cli.usage import usage_errors

OutOption = Annotated[Optional[Path], typer.Option(
    "--out", help="Run folder (default: a new ./fusedce-profile-YYYYmmdd-HHMMSS).")]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace the previous run in a non-empty --out folder.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")]
DeviceOption = Annotated[Optional[str], typer.Option(
    "--device", help="cuda, cuda:K or cpu (default: cuda when a GPU is visible).")]


def resolve_device(device: Optional[str]) -> str:
    """``--device`` as given, or the default (cuda when a GPU is visible, else cpu)."""
    from profiler.grid import default_device

    return device or default_device()


def prepare_out(out: Optional[Path], force: bool, resume: bool = False) -> Path:
    """The run folder of ``--out`` / ``--force`` / ``--resume``; bad combinations exit 2."""
    with usage_errors():  # OutputDirError is a ValueError
        return prepare_out_dir(out, force=force, resume=resume)
