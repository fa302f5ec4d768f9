"""Which folders this process locked for a run, and whether a path still leads to them.

A run locks its folder (:class:`~fusedce_profiler.instrument.runlock.RunLock`) and then writes into it
by path for as long as it runs. If the folder is moved, or replaced by another folder or by a link
(itself or a folder above it), that path leads elsewhere; the folder's identity (device and inode)
taken when it was locked tells them apart, so :mod:`~fusedce_profiler.instrument.confined` can refuse
to read or write through the path.
"""
from __future__ import annotations

import os
from pathlib import Path

_LOCKED: dict[str, tuple[int, int]] = {}  # absolute path of a folder this process locked -> (st_dev, st_ino)


def note_locked_folder(folder: str | Path, fd: int | None) -> None:
    """Remember the folder a run locked at ``folder`` (``fd``: its open descriptor); None: forget it."""
    key = os.path.abspath(folder)
    if fd is None:
        _LOCKED.pop(key, None)
    else:
        info = os.fstat(fd)
        _LOCKED[key] = (info.st_dev, info.st_ino)


def is_locked_one(folder: str | Path, fd: int) -> bool:
    """Whether ``fd`` (``folder`` opened) is the folder this process locked there (True where it locked none)."""
    expected = _LOCKED.get(os.path.abspath(folder))
    info = os.fstat(fd)
    return expected is None or (info.st_dev, info.st_ino) == expected


def locked_above(path: str) -> list[str]:
    """The folders this process locked that hold the absolute ``path`` below them."""
    return [key for key in _LOCKED if path.startswith(key.rstrip(os.sep) + os.sep)]
