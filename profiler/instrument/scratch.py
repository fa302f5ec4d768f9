"""Scratch folders for a worker's log before a run folder exists (a factory's or a back-end's check).

:func:`scratch_folder` makes ``fusedce-<kind>-<pid>-XXXX`` in the temporary folder and removes it
when the block ends. A command killed with ``kill -9`` cannot remove its own, so each new one
first removes those of the same kind whose process is gone and that were untouched for ten
minutes: what a killed command left lasts until a later command of the kind.

Only folders of this user named so, directly in the temporary folder, are removed (never a link
or a file; the walk inside does not follow links), and never one with a file system mounted
inside it (a bind mount included): removing it would remove files that were never the tool's.

Public API: :func:`scratch_folder`.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


_LEFT_AFTER_S = 600.0
"""How long a folder must have been untouched before it counts as left behind (another PID
namespace sharing the temporary folder can hold a live one whose pid is not seen here)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no pid at all (a folder named to trip this)
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
    mounts = None
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        path = root / name
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()):
            continue
        mounts = _mount_points() if mounts is None else mounts
        real = os.path.realpath(path)  # mountinfo names canonical paths
        if not any(m == real or m.startswith(real + os.sep) for m in mounts) and _untouched(path, info):
            with contextlib.suppress(RecursionError):  # a tree changed since it was judged: left
                shutil.rmtree(path, ignore_errors=True)


_MOST_ENTRIES, _DEEPEST = 10_000, 8
"""Entries, and levels of subfolders, a left-behind folder may hold for the sweep to judge it (more:
kept, not walked; the tool's own hold a worker's log one level down)."""


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


def _mount_points(table_path: str = "/proc/self/mountinfo") -> list[str]:
    """Every mount point this process sees (the mount table's fifth field, octal escapes decoded);
    empty where there is no such file (then :func:`_untouched`'s device check remains)."""
    try:
        with open(table_path, encoding="utf-8", errors="surrogateescape") as table:
            fields = [line.split() for line in table]
    except OSError:
        return []
    return [_OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), f[4]) for f in fields if len(f) > 4]


def _untouched(folder: Path, info: os.stat_result) -> bool:
    """Whether ``folder`` and everything in it (its subfolders' files too, links not followed) were
    last changed :data:`_LEFT_AFTER_S` ago or more, all on ``folder``'s own device (a subfolder on
    another is a mount point: kept)."""
    newest, seen, pending = info.st_mtime, 0, [(folder, 0)]
    try:
        while pending:
            below, depth = pending.pop()
            with os.scandir(below) as entries:
                for entry in entries:
                    seen += 1
                    if seen > _MOST_ENTRIES:
                        return False
                    with contextlib.suppress(OSError):
                        entry_info = entry.stat(follow_symlinks=False)
                        newest = max(newest, entry_info.st_mtime)
                        if entry.is_dir(follow_symlinks=False):
                            if entry_info.st_dev != info.st_dev:
                                return False
                            if depth == _DEEPEST:
                                return False
                            pending.append((Path(entry.path), depth + 1))
    except OSError:  # gone meanwhile, or unreadable: not ours to judge, so kept
        return False
    return time.time() - newest >= _LEFT_AFTER_S


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
