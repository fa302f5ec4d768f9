"""Command-line options and their resolution, shared by every sub-command."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_profile import folders
from fusedce_cli.usage import usage_errors

def _out_folder(value: Optional[str]) -> Optional[Path]:
    """``--out``'s folder; an empty value (``--out ""``, an unset shell variable) is refused, never
    read as the current folder. The option is typed as text so that no typer version turns ``""``
    into ``Path(".")`` before this sees it (some pass a ``Path`` here even when told ``parser=str``);
    what this returns, a ``Path``, is what the command gets."""
    if value is not None and not str(value).strip():
        raise typer.BadParameter("an empty folder name; give a folder (. for the current one)")
    return None if value is None else Path(value)


OutOption = Annotated[Optional[str], typer.Option(
    "--out", help="Run folder (default: a new ./fusedce-profile-YYYYmmdd-HHMMSS).", callback=_out_folder)]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace the previous run in a non-empty --out folder.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")]
DeviceOption = Annotated[Optional[str], typer.Option(
    "--device", help="cuda, cuda:K or cpu (default: cuda when a GPU is visible).")]
CellTimeoutOption = Annotated[Optional[float], typer.Option(
    "--cell-timeout", metavar="SECONDS",
    help="Record a cell still running after this long as 'timeout' and go on (default 900 on CUDA, "
         "600 on the CPU; 0: no limit).")]


def resolve_device(device: Optional[str]) -> str:
    """``--device`` as given, or the default (cuda when a GPU is visible, else cpu); a device this
    machine does not have exits 2 saying what to use (:func:`fusedce_profile.checks.resolve_device`)."""
    from fusedce_profile.checks import resolve_device as resolve

    with usage_errors():
        return resolve(device)


_command_locks: list = []
"""Run locks taken by :func:`prepare_out` for the running command (:func:`release_command_locks`)."""


def release_command_locks() -> None:
    """Release the locks :func:`prepare_out` took (the app calls this when a command ends;
    the operating system releases them anyway when the process exits)."""
    while _command_locks:
        _command_locks.pop().release()


def prepare_out(out: Optional[Path], force: bool, resume: Optional[bool] = False, kind: Optional[str] = None) -> Path:
    """The run folder of ``--out`` / ``--force`` / ``--resume``, locked for this command.

    Bad combinations, a folder another run holds, a ``--resume`` of a ``kind`` of run into
    another kind's folder, and a folder that cannot be created or written exit 2 in one line.
    ``resume=None``: the command has no ``--resume`` (its refusals do not suggest one).
    """
    with usage_errors(), os_errors("--out"):  # OutputDirError is a ValueError
        return folders.prepare_out_dir(out, force=force, resume=bool(resume), lock=folders.locking_into(_command_locks),
                                       kind=kind, resume_option=resume is not None)


@contextmanager
def os_errors(what: str = "") -> Iterator[None]:
    """An ``OSError`` inside becomes one error line naming the path and the OS error (exit 2)."""
    with usage_errors(), folders.os_errors(what):
        yield
