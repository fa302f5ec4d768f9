"""Command-line options and their resolution, shared by every sub-command."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli.output_dir import OutputDirError, prepare_out_dir
from fusedce_cli.usage import fail, usage_errors

OutOption = Annotated[Optional[Path], typer.Option(
    "--out", help="Run folder (default: a new ./fusedce-profile-YYYYmmdd-HHMMSS).")]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace the previous run in a non-empty --out folder.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")]
DeviceOption = Annotated[Optional[str], typer.Option(
    "--device", help="cuda, cuda:K or cpu (default: cuda when a GPU is visible).")]
CellTimeoutOption = Annotated[Optional[float], typer.Option(
    "--cell-timeout", metavar="SECONDS", min=0,
    help="Record a cell still running after this long as 'timeout' and go on (default 900 on CUDA, "
         "600 on the CPU; 0: no limit).")]

CELL_TIMEOUT_S = {"cuda": 900.0, "cpu": 600.0}
"""Default ``--cell-timeout`` per device kind: far above a real cell (seconds to a minute),
short enough that a hung back-end does not hold a CI job for hours."""


def resolve_device(device: Optional[str]) -> str:
    """``--device`` as given, or the default (cuda when a GPU is visible, else cpu).

    A device this machine does not have exits 2 saying what to use (:func:`fusedce_cli.checks.check_device`).
    """
    from fusedce_cli.checks import check_device
    from fusedce_profiler.grid.spec import default_device

    with usage_errors():
        return check_device(device or default_device())


def resolve_cell_timeout(seconds: Optional[float], device: str) -> float | None:
    """``--cell-timeout`` in seconds (``None``: no limit), its default for ``device`` when not given."""
    if seconds is None:
        return CELL_TIMEOUT_S[device.split(":")[0]]
    return seconds or None


_command_locks: list = []
"""Run locks taken by :func:`prepare_out` for the running command (:func:`release_command_locks`)."""


def _lock_for_this_command(folder: Path) -> None:
    """Take ``folder``'s run lock until the running command ends (a second run exits 2)."""
    from fusedce_profiler.instrument import store

    try:
        _command_locks.append(store.RunLock(folder).acquire())
    except store.FolderInUse as exc:
        raise OutputDirError(str(exc)) from None


def release_command_locks() -> None:
    """Release the locks :func:`prepare_out` took (the app calls this when a command ends;
    the operating system releases them anyway when the process exits)."""
    while _command_locks:
        _command_locks.pop().release()


def prepare_out(out: Optional[Path], force: bool, resume: bool = False) -> Path:
    """The run folder of ``--out`` / ``--force`` / ``--resume``, locked for this command.

    Bad combinations, a folder another run holds, and a folder that cannot be created or
    written exit 2 in one line.
    """
    with usage_errors(), os_errors("--out"):  # OutputDirError is a ValueError
        return prepare_out_dir(out, force=force, resume=resume, lock=_lock_for_this_command)


def describe_os_error(exc: OSError) -> str:
    """``PATH: strerror`` (the path the OS error names, else the message)."""
    path = exc.filename or ""
    reason = exc.strerror or str(exc)
    return f"{path}: {reason}" if path else reason


@contextmanager
def os_errors(what: str = "") -> Iterator[None]:
    """An ``OSError`` inside becomes one error line naming the path and the OS error (exit 2)."""
    try:
        yield
    except OSError as exc:
        prefix = f"{what} " if what else ""
        raise fail(f"{prefix}{describe_os_error(exc)}") from None
