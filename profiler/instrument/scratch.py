"""Scratch folders for a worker's log before a run folder exists (a factory's or a back-end's check).

:func:`scratch_folder` makes ``fusedce-<kind>-<pid>-XXXX`` in the temporary folder and removes it
when the block ends. A command killed with ``kill -9`` cannot remove its own, so each new one
first removes those of the same kind whose process is gone: what a killed command left lasts
until the next command of the kind, never longer.

Only folders of this user named so, directly in the temporary folder, are removed (never a link
or a file; the walk inside does not follow links).

Public API: :func:`scratch_folder`.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_left_behind(kind: str, root: Path) -> None:
    """Remove ``root``'s ``fusedce-<kind>-<pid>-*`` folders of this user whose process is gone."""
    pattern = re.compile(rf"fusedce-{re.escape(kind)}-(\d+)-[^/]+")
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        path = root / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """A new, empty folder of this process's (mode 0700) for the block; removed when it ends."""
    root = Path(tempfile.gettempdir())
    _remove_left_behind(kind, root)
    folder = Path(tempfile.mkdtemp(prefix=f"fusedce-{kind}-{os.getpid()}-", dir=root))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
