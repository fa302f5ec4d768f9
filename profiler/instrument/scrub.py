"""What a run folder must not carry about the machine it ran on: its paths and its name.

A run folder is made to be attached to a bug report, yet what a run stores names the machine:
a failed cell's message and traceback, a hostile factory's error, a worker's log, the frames of
an allocator snapshot name the Python installation, the home folder, the current folder and the
run folder by their absolute paths. Everything the store writes passes through here first
(:mod:`fusedce_profiler.instrument.store`), and a worker's log is rewritten when the worker
ends, with each of those replaced by a placeholder (the environment block is the one place that
says what the machine was, and it holds versions only):

==========================  ===============
absolute path or name        placeholder
==========================  ===============
the run folder               ``‹run folder›``
the current folder           ``‹cwd›``
the Python installation      ``‹python›`` (``sys.prefix``, ``sys.base_prefix``, ``sys.exec_prefix``)
the tool's own source        ``‹fusedce›`` (the folder holding its packages: a checkout when installed
                             editable; inside ``‹python›`` otherwise)
each ``PYTHONPATH`` folder   ``‹pythonpath›`` (where a user's factory or loss module is imported from)
the home folder              ``~``
torch.compile's cache        ``torchinductor_‹user›`` (``/tmp/torchinductor_USER``: the user's name)
the host name                ``‹host›``
==========================  ===============

The placeholders are bracketed with ``‹ ›`` (U+2039, U+203A), which neither Markdown nor HTML
reads as markup: a page is scrubbed after it is rendered, so ``<…>`` would become a tag there.
Longer paths are replaced first, so a run folder inside the home folder becomes
``‹run folder›``, not ``~/…``. Public API: :func:`machine_names`, :func:`scrub_text`,
:func:`scrub_value`, :func:`scrub_file`, :func:`current_folder`.
"""
from __future__ import annotations

import functools
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

Names = tuple[tuple[str, str], ...]
"""``(text, placeholder)`` pairs, longest text first (what :func:`machine_names` returns)."""


def current_folder() -> str | None:
    """The current folder's path (None once it has been removed)."""
    try:
        return os.getcwd()
    except OSError:
        return None


_FOLDER_AT_START = current_folder()
"""The current folder when this module was imported (the command's start)."""


def machine_names(run_folder: str | Path | None = None) -> Names:
    """``(text, placeholder)`` pairs to replace, longest text first. Paths shorter than five
    characters (``/``, ``/tmp``) and host names shorter than four are left alone: replacing them
    would rewrite ordinary words."""
    pairs: dict[str, str] = {}
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        pairs[os.path.realpath(path)] = "‹python›"
        pairs[path] = "‹python›"
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # a more particular name below wins
        if os.path.isabs(entry):
            pairs[os.path.normpath(entry)] = pairs[os.path.realpath(entry)] = "‹pythonpath›"
    source = str(Path(__file__).resolve().parents[2])  # profiler/instrument/scrub.py → the tool's root
    pairs[source] = "‹fusedce›"
    home = os.path.expanduser("~")
    pairs[home] = "~"
    pairs[os.path.realpath(home)] = "~"
    cwd = current_folder() or _FOLDER_AT_START  # a folder removed since the start keeps its name
    if cwd is not None:
        pairs[cwd], pairs[os.path.realpath(cwd)] = "‹cwd›", "‹cwd›"
    if run_folder is not None:
        folder = os.path.normpath(os.path.join(cwd or os.sep, run_folder))  # "a/../b" is "b" here
        pairs[folder], pairs[os.path.realpath(folder)] = "‹run folder›", "‹run folder›"
        if os.path.isabs(run_folder):  # and as the user wrote it, where messages quote it so
            pairs[str(run_folder)] = "‹run folder›"
    try:  # torch.compile's cache folder names the user (/tmp/torchinductor_ann): the frames of a trace show it
        import getpass

        pairs[f"torchinductor_{getpass.getuser()}"] = "torchinductor_‹user›"
    except (KeyError, OSError, ImportError):  # no name for this uid
        pass
    pairs = {text: name for text, name in pairs.items() if len(text) >= 5 and text != os.sep}
    host = socket.gethostname()
    found = sorted(pairs.items(), key=lambda pair: -len(pair[0]))
    if len(host) >= 4:
        found.append((host, "‹host›"))
    return tuple(found)


@functools.lru_cache(maxsize=32)
def _pattern(names: Names) -> tuple[re.Pattern, dict[str, str]]:
    """One alternation of every name, longest first (at one position the longest path wins).
    A path matches only where it ends at a path boundary — not continued by a letter, digit,
    ``_``, ``-`` or a ``.`` that starts a suffix — so ``/home/ann`` matches in ``/home/ann/x``
    and at the end of a sentence, not in ``/home/anna`` or ``/home/ann.bak``; the host name
    matches only as a whole word."""
    branches = []
    for name, placeholder in names:
        if placeholder == "‹host›":
            branches.append(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")
        else:
            branches.append(rf"{re.escape(name)}(?![\w-]|\.[\w-])")
    return re.compile("|".join(branches)), dict(names)


def scrub_text(text: str, names: Names) -> str:
    """``text`` with every name of ``names`` replaced by its placeholder (see :func:`_pattern`)."""
    if not names or not text:
        return text
    pattern, placeholders = _pattern(tuple(names))
    return pattern.sub(lambda match: placeholders[match.group(0)], text)


def scrub_value(value: Any, names: Names) -> Any:
    """A copy of ``value`` (JSON-like: dicts, lists, tuples, strings, numbers; an allocator
    snapshot) with every string, keys included, scrubbed by :func:`scrub_text`. A string met
    twice is scrubbed once (a snapshot repeats each frame's file name thousands of times)."""
    seen: dict[str, str] = {}

    def text(item: str) -> str:
        if item not in seen:
            seen[item] = scrub_text(item, names)
        return seen[item]

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {walk(key): walk(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return type(item)(walk(inner) for inner in item) if type(item) in (list, tuple) else item
        return item

    return walk(value)


LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 3 << 20
"""What :func:`scrub_file` keeps of a longer log: its start (the job's header, the first error)
and its end (the traceback that ended it); user code that prints without end would otherwise
fill the folder a user attaches to a bug report (and this rewrite's memory)."""


def _bounded_text(fd: int) -> tuple[str, bool]:
    """The file's text, or its first :data:`LOG_HEAD_BYTES` and last :data:`LOG_TAIL_BYTES` with a
    line saying how much was cut between them; whether anything was cut."""
    size = os.fstat(fd).st_size
    if size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
        return os.pread(fd, size, 0).decode("utf-8", errors="replace"), False
    head = os.pread(fd, LOG_HEAD_BYTES, 0).decode("utf-8", errors="replace")
    tail = os.pread(fd, LOG_TAIL_BYTES, size - LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    cut = size - LOG_HEAD_BYTES - LOG_TAIL_BYTES
    return f"{head}\n[... {cut} bytes of output cut: the log keeps its first and last lines ...]\n{tail}", True


LOCK_WAIT_S = 5.0
"""How long :func:`scrub_file` waits for another process's rewrite of the same file to end."""


def _locked(fd: int, wait_s: float) -> bool:
    """Take an exclusive ``flock`` of ``fd``, waiting at most ``wait_s`` (a holder that never lets go
    — the job's own code — costs that long, then the file is left as it is)."""
    import fcntl
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        except OSError:
            return False


def scrub_file(folder: str | Path, path: str | Path) -> bool:
    """Rewrite ``path``, a text file below ``folder`` (never through a link), with the machine's
    names replaced (:func:`scrub_text`, the run folder being ``folder``) and, when longer, only
    its start and end kept (:data:`LOG_HEAD_BYTES`, :data:`LOG_TAIL_BYTES`). Best effort: a file
    that cannot be read or written is left as it was. Whether it was read (and rewritten where needed):
    ``False`` when it could not be, or its lock was not given up in time.

    Read and rewritten through one descriptor under an exclusive ``flock``: after a ``kill -9`` of
    the command both the worker and its reaper scrub the worker's log, each killing the other's
    process group only once its own rewrite is done; the lock keeps either from reading a half-written
    file or being killed in the middle of writing one (the second finds nothing left to change)."""
    from fusedce_profiler.instrument.confined import open_inside

    try:
        with os.fdopen(open_inside(folder, path, os.O_RDWR), "r+b") as handle:
            fd = handle.fileno()
            if not _locked(fd, LOCK_WAIT_S):
                return False
            text, cut = _bounded_text(fd)
            scrubbed = scrub_text(text, machine_names(folder))
            if scrubbed != text or cut:
                data = scrubbed.encode("utf-8")
                written = 0
                while written < len(data):
                    written += os.pwrite(fd, data[written:], written)
                os.ftruncate(fd, len(data))
        return True
    except Exception:  # noqa: BLE001 - a log that cannot be rewritten stays as the worker left it
        return False
