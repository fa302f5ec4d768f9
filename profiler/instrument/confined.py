"""Reading a run folder that may come from a stranger: nothing through a link, nothing unbounded.

A run folder is made to be attached to a bug report and opened by someone else, so every file
the tool reads from one is opened here, under two rules:

**Confinement.** A file is opened relative to the folder, one path component at a time, with
``O_NOFOLLOW``: a symbolic link anywhere below the folder (``environment.json`` linked to a
credentials file, a linked ``snapshots/``) is refused, never followed. The folder itself is the
one the user named, links included. Only regular files are read (a FIFO would block the reader).

**Bounds.** Each kind of file has a size limit (:data:`SIZE_LIMITS`, by file name), checked on the
open file before a byte is parsed; JSON nesting is limited to :data:`MAX_NESTING` levels, checked
on the raw bytes before the decoder recurses. JSON-lines files are streamed, one bounded line at
a time (:func:`jsonl_lines`), never read whole.

A violation is :class:`FolderRefused`: one line naming the file and the rule, which the command
line reports with exit code 2. It is neither a ``ValueError`` nor an ``OSError`` on purpose: the
readers turn those into "this row or file is damaged" notes, and a refused file must stop the
command instead.

Public API: :class:`FolderRefused`, :func:`open_inside`, :func:`read_bytes`, :func:`loads`,
:func:`jsonl_lines`, :func:`user_text`, :func:`check_nesting`, :func:`size_limit`, :func:`open_own_file`,
:func:`not_own_file`, :func:`refuse_linked_folder`, :data:`SIZE_LIMITS`, :data:`MAX_NESTING`,
:data:`MAX_LINE_BYTES`.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any

from fusedce_profiler.instrument import folder_identity

MIB = 1 << 20

SIZE_LIMITS = {
    "environment.json": 1 * MIB,
    "plan.json": 16 * MIB, "model_plan.json": 16 * MIB,
    "parity.json": 16 * MIB, "doctor.json": 16 * MIB,
    "explain.json": 16 * MIB, "fit.json": 16 * MIB,
    ".timeline.json": 64 * MIB,
    "results.jsonl": 256 * MIB,
    "model_results.jsonl": 256 * MIB,
    "recorded_steps.jsonl": 256 * MIB,
}
"""Largest file of each kind the tool reads (bytes), by file name or, with a leading dot, by
suffix. Each is far above what a real run writes: an environment is ~2 KB, a plan ~300 bytes per
cell, a result row ~1.5 KB, a timeline a few MB for a large step."""

DEFAULT_SIZE_LIMIT = 16 * MIB
"""The limit of a JSON file of a kind not listed in :data:`SIZE_LIMITS` (a ``--config`` file)."""

MAX_LINE_BYTES = 4 * MIB
"""Longest line of a JSON-lines file (one record)."""

MAX_LINES = 20_000
"""Most lines of a JSON-lines file: a grid of 20,000 cells takes days; a file of 200,000 small
rows fits the size limit, yet its report would render for hours."""

MAX_NESTING = 64
"""Deepest nesting of arrays and objects in any JSON the tool reads; its own files nest at most
five levels, and the decoder recurses once per level."""

_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY


class FolderRefused(Exception):
    """A file of a run folder the tool will not read or write: a symbolic link, not a regular
    file, over its size limit, nested too deeply. ``str()`` is one line naming the file."""


def size_limit(path: str | PurePath) -> int:
    """The size limit of the file ``path`` names (:data:`SIZE_LIMITS`)."""
    name = PurePath(path).name
    if name in SIZE_LIMITS:
        return SIZE_LIMITS[name]
    for suffix, limit in SIZE_LIMITS.items():
        if suffix.startswith(".") and name.endswith(suffix):
            return limit
    return DEFAULT_SIZE_LIMIT


def _relative_parts(folder: Path, path: Path) -> tuple[str, ...]:
    """The components of ``path`` below ``folder`` (both taken from the current folder when
    relative); :class:`FolderRefused` when it is not below it."""
    try:
        parts = Path(os.path.abspath(path)).relative_to(os.path.abspath(folder)).parts
    except ValueError:
        raise FolderRefused(f"{path}: outside the run folder {folder}") from None
    if not parts:
        raise FolderRefused(f"{path}: not a file inside the run folder {folder}")
    return parts


WRITE_LINK_REFUSED = "a symbolic link; a run folder's files are written in place, never through links"
"""Why the store refuses to write through a link (the text of its ``OSError``)."""

MOVED = ("not the folder this run locked (moved or replaced since, or a folder above it); nothing is written "
         "through its path")
"""Why a run's folder is refused once its path no longer leads to the folder it locked."""

WRITE_SHARED_REFUSED = ("not a regular file of the folder alone (a hard link, a named pipe, a folder or a device); "
                        "a run folder's files are written in place, never through links")
"""Why the store refuses to append to or truncate a file that has another name (a hard link to a
file elsewhere would be written there), or is not a regular file (a pipe would block)."""

FOLDER_LINK_REFUSED = ("a symbolic link; a run writes only into the folder it names, never through a link: "
                       "name the folder itself")
"""Why a run refuses an output folder that is a link (the folder it writes into, and removes a
previous run's files from with ``force``, must be the one named)."""

_WRITING = os.O_WRONLY | os.O_RDWR
_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)  # the system's refusal, not the file's


def not_own_file(info: os.stat_result) -> str | None:
    """Why a file with ``info`` (``os.lstat``/``os.fstat``) is no folder's own file to write in place:
    :data:`WRITE_LINK_REFUSED` for a symbolic link, :data:`WRITE_SHARED_REFUSED` for anything but a
    regular file with one name (a hard link, a named pipe, a folder); ``None`` for its own file."""
    if stat.S_ISLNK(info.st_mode):
        return WRITE_LINK_REFUSED
    return None if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 else WRITE_SHARED_REFUSED


def open_own_file(name: str | Path, flags: int, path: str | Path, mode: int = 0o666, dir_fd: int | None = None) -> int:
    """A descriptor of the file ``name`` (relative to ``dir_fd`` when given) opened with ``flags``
    to be written in place, when it is the folder's own regular file (:func:`not_own_file`; else ``OSError``
    ``EMLINK`` naming ``path``).

    Opened without following a link and without blocking: a named pipe in place of the file would
    block the open (until a reader comes) or every write, so it is refused, like a link, with an
    ``OSError`` naming ``path`` (a link: ``ELOOP``, :data:`WRITE_LINK_REFUSED`); the descriptor
    returned blocks as usual."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, WRITE_LINK_REFUSED, str(path)) from None
        if exc.errno == errno.ENXIO:  # a pipe no one reads
            raise OSError(errno.ENXIO, WRITE_SHARED_REFUSED, str(path)) from None
        exc.filename = str(path)
        raise
    try:
        if not_own_file(os.fstat(fd)) is not None:  # a hard link (O_NOFOLLOW stops a symbolic one), a pipe
            raise OSError(errno.EMLINK, WRITE_SHARED_REFUSED, str(path))
        os.set_blocking(fd, True)
    except BaseException:  # refused, or anything else between the open and the return: no descriptor leaks
        os.close(fd)
        raise
    return fd


def refuse_linked_folder(folder: str | Path) -> None:
    """:class:`FolderRefused` when ``folder``, the folder a run is to write into, is a symbolic link
    (:data:`FOLDER_LINK_REFUSED`): checked before the run locks, writes or removes anything."""
    if os.path.islink(folder):
        raise FolderRefused(f"{folder}: {FOLDER_LINK_REFUSED}")


def _refused_link(path: Path) -> FolderRefused:
    return FolderRefused(f"{path}: a symbolic link; a run folder's files are read only inside it, "
                         "never through links")


def _check_locked(folder: Path, fd: int) -> None:
    """:class:`FolderRefused` when ``fd`` (``folder`` opened) is not the folder this process locked there."""
    if not folder_identity.is_locked_one(folder, fd):
        raise FolderRefused(f"{folder}: {MOVED}")


def check_locked_ancestors(path: str | Path) -> None:
    """:class:`FolderRefused` when a folder this process locked above ``path`` is gone from its path,
    moved, or replaced (by a link, or through a folder above it): checked before a file is made there."""
    for folder in folder_identity.locked_above(os.path.abspath(path)):
        try:
            fd = os.open(folder, _OPEN_DIR)
        except OSError as exc:  # no descriptor left says nothing of the folder
            raise exc if exc.errno in _NO_DESCRIPTOR else FolderRefused(f"{folder}: {MOVED}")
        try:
            _check_locked(Path(folder), fd)
        finally:
            os.close(fd)


def check_folder(folder: str | Path) -> None:
    """:class:`FolderRefused` when ``folder`` is now a symbolic link or not the folder this process locked
    there; ``FileNotFoundError`` when it is gone (nothing is made in its place)."""
    refuse_linked_folder(folder)
    fd = os.open(folder, _OPEN_DIR)
    try:
        _check_locked(Path(folder), fd)
    finally:
        os.close(fd)


def open_inside(folder: str | Path, path: str | Path, flags: int = _OPEN_READ, mode: int = 0o666) -> int:
    """A file descriptor of ``path``, a file below ``folder``, opened without following a link
    at or below ``folder``; the caller closes it.

    ``flags`` default to reading; ``O_NOFOLLOW`` is always added. A link on the way is
    :class:`FolderRefused` naming it; a missing file is ``FileNotFoundError``; a file opened for
    writing that has another name or is not a regular file is refused (:func:`open_own_file`).
    """
    folder, path = Path(folder), Path(path)
    parts = _relative_parts(folder, path)
    below = [folder.joinpath(*parts[:index + 1]) for index in range(len(parts))]  # as the caller named them
    try:
        fd = os.open(folder, _OPEN_DIR)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and folder.is_symlink():
            raise _refused_link(folder) from None
        raise
    try:
        _check_locked(folder, fd)
        for part, named in zip(parts[:-1], below):
            try:
                inner = os.open(part, _OPEN_DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and named.is_symlink():
                    raise _refused_link(named) from None
                exc.filename = str(named)
                raise
            os.close(fd)
            fd = inner
        if flags & _WRITING:
            try:
                return open_own_file(parts[-1], flags, path, mode, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refused_link(path) from None
                raise
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused_link(path) from None
            if exc.errno == errno.ENXIO:  # a socket, or a device without its driver
                raise FolderRefused(f"{path}: not a regular file") from None
            exc.filename = str(path)
            raise
    finally:
        os.close(fd)


def _read_regular(fd: int, path: Path, limit: int) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise FolderRefused(f"{path}: not a regular file")
    if info.st_size > limit:
        raise FolderRefused(f"{path}: {info.st_size} bytes, over the limit of {limit} bytes for this kind of file")
    os.set_blocking(fd, True)
    chunks, total = [], 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # it grew after the check
            raise FolderRefused(f"{path}: over the limit of {limit} bytes for this kind of file")
    return b"".join(chunks)


def read_bytes(path: str | Path, inside: str | Path | None = None, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a file of the folder ``inside`` (default: its own folder), read
    without following links and refused over ``limit`` (default :func:`size_limit`)."""
    path = Path(path)
    folder = Path(inside) if inside is not None else path.parent
    fd = open_inside(folder, path)
    try:
        return _read_regular(fd, path, size_limit(path) if limit is None else limit)
    finally:
        os.close(fd)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``data`` (brackets inside strings do not count)."""
    import numpy as np

    brackets = _STRING.sub(b'""', data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


MAX_INT_DIGITS = 40
"""The most digits of an integer in a stored file: more than any byte count or size the tool
writes (2⁶⁴ has 20), far below the point where converting it costs time (Python refuses 4,300)."""


class _TooManyDigits(ValueError):
    pass


def _stored_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooManyDigits(f"an integer of {len(text.lstrip('-')):,} digits, more than the {MAX_INT_DIGITS} "
                             "any stored value has")
    return int(text)


def loads(data: bytes, path: str | Path) -> Any:
    """Decode the JSON text ``data`` read from ``path``: ``ValueError`` naming the file when it is
    not UTF-8 JSON, :class:`FolderRefused` when it nests deeper than :data:`MAX_NESTING`."""
    if nesting_depth(data) > MAX_NESTING:
        raise FolderRefused(f"{path}: JSON nested deeper than the limit of {MAX_NESTING} levels")
    try:
        return json.loads(data.decode("utf-8"), parse_int=_stored_int)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except _TooManyDigits as exc:
        raise ValueError(f"{path}: {exc}") from None
    except RecursionError:  # a smaller stack than the nesting limit assumes
        raise FolderRefused(f"{path}: JSON nested too deeply to read") from None


def _file_kind(mode: int) -> str:
    """What a file that is not a regular one is: ``"a named pipe"``, ``"a folder"`` …"""
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    return next((name for test, name in kinds if test(mode)), "not a file")


def user_text(path: str | Path) -> str:
    """The UTF-8 text of a file the user named on the command line (a ``--config``, an ``--hf``
    config.json; a link is fine there: the user chose it), refused when it is not a regular file (a
    named pipe would block the read) or over :data:`DEFAULT_SIZE_LIMIT`, before it is read:
    ``ValueError`` naming the file. ``OSError`` and
    ``UnicodeDecodeError`` propagate for the caller to word."""
    path = Path(path)
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):  # a pipe would block the read, a device never end it
        raise ValueError(f"{path}: not a regular file ({_file_kind(info.st_mode)}); give a JSON or TOML file")
    size = info.st_size
    if size > DEFAULT_SIZE_LIMIT:
        raise ValueError(f"{path}: {size} bytes, over the limit of {DEFAULT_SIZE_LIMIT} bytes for a config file")
    return path.read_text(encoding="utf-8")


def check_nesting(text: str, path: str | Path) -> str:
    """``text`` when its JSON nests at most :data:`MAX_NESTING` levels; ``ValueError`` naming
    ``path`` otherwise (a user's file: a usage error, not a refused run-folder file)."""
    if nesting_depth(text.encode("utf-8")) > MAX_NESTING:
        raise ValueError(f"{path}: JSON nested deeper than the limit of {MAX_NESTING} levels")
    return text


def _count_lines(fh, size: int) -> int:
    """The lines of the first ``size`` bytes of the binary file ``fh`` (an unterminated last one
    counted), read in 1 MiB blocks; ``fh`` is left at its start."""
    lines, last = 0, b"\n"
    while size > 0 and (block := fh.read(min(1 << 20, size))):
        lines += block.count(b"\n")
        last, size = block[-1:], size - len(block)
    fh.seek(0)
    return lines + (last != b"\n")


def jsonl_lines(path: str | Path, inside: str | Path | None = None) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line without its newline, whether it is an unterminated last line) of a JSON-lines
    file, streamed: the bytes it held when opened (rows appended meanwhile would pass the size limit
    unchecked); blank lines included. ``FileNotFoundError`` when it is missing; :class:`FolderRefused` for
    a link, a file over its size limit, a line over :data:`MAX_LINE_BYTES` or more than :data:`MAX_LINES` lines."""
    path = Path(path)
    fd = open_inside(Path(inside) if inside is not None else path.parent, path)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # before fdopen, which names a folder by its descriptor
        os.close(fd)
        raise FolderRefused(f"{path}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        limit = size_limit(path)
        if info.st_size > limit:
            raise FolderRefused(f"{path}: {info.st_size} bytes, over the limit of {limit} bytes for this kind of file")
        os.set_blocking(fd, True)
        if _count_lines(fh, info.st_size) > MAX_LINES:  # counted before a byte is parsed (0.1 s a 256 MiB)
            raise FolderRefused(f"{path}: more than {MAX_LINES} lines, over the limit for this kind of file")
        number, left = 0, info.st_size
        while left > 0 and (raw := fh.readline(min(MAX_LINE_BYTES + 1, left))):
            number, left = number + 1, left - len(raw)
            if number > MAX_LINES:
                raise FolderRefused(f"{path}: more than {MAX_LINES} lines, over the limit for this kind of file")
            terminated = raw.endswith(b"\n")
            if not terminated and len(raw) > MAX_LINE_BYTES:
                raise FolderRefused(f"{path}:{number}: a line over the limit of {MAX_LINE_BYTES} bytes")
            yield number, raw.rstrip(b"\n"), not terminated
