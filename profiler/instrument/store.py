"""The run folder on disk: one writer and one reader for every file a run stores.

Layout of a run folder (each name defined here once)::

    results.jsonl        grid: one CellResult per line, appended as each cell finishes
    model_results.jsonl  model mode: one ModelResult per line
    fit.json             model mode --fit: the searches
    parity.json          parity: the whole ParityReport
    doctor.json          doctor: the checks
    recorded_steps.jsonl a training step recorded inside the user's own loop
                         (fusedce_profiler.instrument.recording): one RecordedStep per line
    environment.json     what ran it
    plan.json            grid: every cell the run set out to measure (written when it starts)
    snapshots/           <cell>.pickle (raw allocator snapshot, for PyTorch's memory viewer)
                         and <cell>.timeline.json (what the report draws)
    logs/                each worker's output
    .lock                held while a run writes into the folder

**Reading** has one policy for every JSON-lines file (:func:`read_jsonl`): a missing file
gives no records and says so; a blank line is ignored; a line that is not JSON, or whose
fields do not validate, is skipped and reported with its number and the reason — a last
line without its newline is named as an interrupted write. Nothing is skipped silently:
callers show :attr:`Loaded.problems`.

**Writing**: a result line is appended, flushed and fsync'ed (:func:`append_jsonl`), so a
killed run loses at most the line in flight; every other file is written to a temporary
name and renamed over the old one (:func:`write_text`), so a failed write never leaves a
truncated file, and a symbolic link in the folder is replaced, never followed. JSON is
strict: a non-finite float is stored as the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"`` (:func:`strict_json`) and read back by :func:`float_field`.

Nothing here unpickles: the raw snapshot is written for the user's viewer and never read.

Public API: the file names, :func:`read_jsonl`, :class:`Loaded`, :func:`append_jsonl`,
:func:`cut_partial_line`, :func:`write_text`, :func:`write_json`, :func:`read_json`,
:func:`strict_json`, :func:`float_field`, :class:`RunLock`, :class:`FolderInUse`.
"""
from __future__ import annotations

import errno
import json
import math
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

RESULTS_FILE = "results.jsonl"
MODEL_RESULTS_FILE = "model_results.jsonl"
FIT_FILE = "fit.json"
PARITY_FILE = "parity.json"
DOCTOR_FILE = "doctor.json"
EXPLAIN_FILE = "explain.json"
ENVIRONMENT_FILE = "environment.json"
PLAN_FILE = "plan.json"
SNAPSHOTS_DIR = "snapshots"
LOGS_DIR = "logs"
LOCK_FILE = ".lock"
TIMELINE_SUFFIX = ".timeline.json"
SNAPSHOT_SUFFIX = ".pickle"
RECORDED_STEPS_FILE = "recorded_steps.jsonl"

T = TypeVar("T")

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class LineProblem:
    """A line of a JSON-lines file that was not read: its number and why."""

    line: int
    reason: str

    def describe(self, path: Path) -> str:
        return f"{path}:{self.line}: {self.reason}"


@dataclass
class Loaded(Generic[T]):
    """What :func:`read_jsonl` read: the records, and every line it could not read."""

    path: Path
    records: list[T] = field(default_factory=list)
    skipped: list[LineProblem] = field(default_factory=list)
    missing: bool = False

    @property
    def problems(self) -> list[str]:
        """One sentence per line that was not read (empty when the file was read whole)."""
        return [p.describe(self.path) for p in self.skipped]


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its string spelling (valid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """Strict JSON text of ``value`` (see :func:`strict_json`)."""
    return json.dumps(strict_json(value), allow_nan=False, **kwargs)


def float_field(value: Any, name: str, *, optional: bool = True) -> float | None:
    """A stored float: a number, one of the non-finite spellings, or ``None`` when optional."""
    if value is None and optional:
        return None
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def int_field(value: Any, name: str, *, optional: bool = True, minimum: int | None = None) -> int | None:
    """A stored integer (``None`` when optional); ``ValueError`` naming the field otherwise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def read_jsonl(path: str | Path, parse: Callable[[dict], T]) -> Loaded[T]:
    """Every readable record of a JSON-lines file, and what could not be read (see above).

    ``parse`` turns one decoded JSON object into a record; it raises ``ValueError``,
    ``TypeError`` or ``KeyError`` for a row whose fields do not validate.
    """
    path = Path(path)
    loaded: Loaded[T] = Loaded(path)
    if not path.is_file():
        loaded.missing = True
        return loaded
    data = path.read_bytes()
    lines = data.split(b"\n")
    unterminated = bool(data) and not data.endswith(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number == len(lines)
        try:
            obj = json.loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
            loaded.records.append(parse(obj))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            reason = f"not a valid row ({exc})"
            if last and unterminated:
                reason = f"a last line cut short by an interrupted write ({exc})"
            loaded.skipped.append(LineProblem(number, reason))
    return loaded


def cut_partial_line(path: str | Path) -> bool:
    """Cut an unterminated last line (a write interrupted by a kill) before appending.

    Returns whether anything was cut, so the caller can say so.
    """
    path = Path(path)
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with path.open("r+b") as fh:
        fh.truncate(data.rfind(b"\n") + 1)
    return True


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a line, flushed and fsync'ed (a kill loses at most this line)."""
    path = Path(path)
    _refuse_link(path)
    line = dumps(record, sort_keys=True) + "\n"
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise _naming(exc, path) from None


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise OSError(errno.ELOOP, "a symbolic link; a run folder's files are written in place, never through links",
                      str(path))


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` when it names no file itself (a failed ``write`` or ``fsync``)."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, then a rename.

    A failed write leaves the old file as it was; a symbolic link at ``path`` is replaced by
    the new file (the file it pointed to is untouched).
    """
    return write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Binary form of :func:`write_text`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename in (None, tmp):
            exc.filename = str(path)  # name the file being written, not its temporary
        raise
    return path


def write_json(path: str | Path, value: Any) -> Path:
    """Strict JSON, indented, written atomically."""
    return write_text(path, dumps(value, indent=1, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    """A JSON file written by :func:`write_json`; ``ValueError`` naming the file otherwise."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


class FolderInUse(RuntimeError):
    """Another run holds the folder's lock."""


class RunLock:
    """An exclusive lock on a run folder while a run writes into it (``fcntl.flock``).

    The lock file records who holds it (pid, host, start time, command line), so a second
    run can say who holds it. The operating system releases the lock when the holder exits,
    however it exits, so a killed run never leaves the folder locked. Within one process the
    lock is re-entrant: a command that locks its folder first (before ``--force`` removes
    anything) and the run it then starts share one lock, released when both released it.
    """

    _held: dict[Path, list] = {}  # resolved lock path -> [file, count], this process's locks

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK_FILE
        self._key: Path | None = None

    def acquire(self) -> "RunLock":
        import fcntl

        if self._key is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_link(self.path)
        key = self.path.resolve()
        if key in RunLock._held:
            RunLock._held[key][1] += 1
            self._key = key
            return self
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            from fusedce_profiler.instrument.text import shorten

            raise FolderInUse(f"{self.path.parent} is in use by {shorten(holder, 200)}; wait for it to finish "
                              "or choose another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')} ({' '.join(sys.argv)})\n")
        fh.flush()
        RunLock._held[key] = [fh, 1]
        self._key = key
        return self

    def release(self) -> None:
        if self._key is None:
            return
        entry = RunLock._held[self._key]
        entry[1] -= 1
        if entry[1] == 0:
            import fcntl

            del RunLock._held[self._key]
            fcntl.flock(entry[0].fileno(), fcntl.LOCK_UN)
            entry[0].close()
        self._key = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
