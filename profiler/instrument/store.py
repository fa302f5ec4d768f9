"""The run folder on disk: one writer and one reader for every file a run stores.

Layout of a run folder (each name defined here once)::

    results.jsonl        grid: one CellResult per line, appended as each cell finishes
    model_results.jsonl  model mode: one ModelResult per line
    fit.json             model mode --fit: the searches
    parity.json          parity: the whole ParityReport
    doctor.json          doctor: the checks
    explain.json         explain: the hypotheses and their verdicts
    explain_steps.jsonl  explain: every calibration and confirmation step, appended as it finishes
    recorded_steps.jsonl a training step recorded inside the user's own loop
                         (fusedce_profiler.instrument.recording): one RecordedStep per line
    environment.json     what ran it
    plan.json            grid: every cell the run set out to measure (written when it starts)
    snapshots/           <cell>.pickle (raw allocator snapshot, for PyTorch's memory viewer)
                         and <cell>.timeline.json (what the report draws)
    logs/                each worker's output
    .lock                who holds the folder (pid and start time), while a run writes into it

**Reading** goes through :mod:`fusedce_profiler.instrument.confined` for every file: opened
inside the folder without following a link, within a size limit per kind of file and a JSON
nesting limit; JSON-lines files are streamed. A violation is
:class:`~fusedce_profiler.instrument.confined.FolderRefused` (one line, exit 2 on the command line).
Every JSON-lines file has one policy (:func:`read_jsonl`): a missing file
gives no records and says so; a blank line is ignored; a line that is not JSON, or whose
fields do not validate, is skipped and reported with its number and the reason — a last
line without its newline is named as an interrupted write. Nothing is skipped silently:
callers show :attr:`Loaded.problems`.

**Writing** names nothing of the machine: every record, text and report passes through
:mod:`~fusedce_profiler.instrument.scrub` on its way to disk, so the run folder, the current
folder, the Python installation, the home folder and the host name are stored as placeholders
(the run folder of a file being its folder, or the folder above ``snapshots/``, ``logs/`` and
``plots/``). A result line is appended, flushed and fsync'ed (:func:`append_jsonl`), so a
killed run loses at most the line in flight; every other file is written to a temporary
name and renamed over the old one (:func:`write_text`, :func:`write_stream`), so a failed
write never leaves a truncated file (inside :func:`~fusedce_profiler.instrument.staging.all_or_nothing`
the renames of a whole report wait for its end), and a symbolic link in the folder is replaced,
never followed; a linked parent folder is refused. Files follow the umask. JSON is strict: a
non-finite float is stored as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``
(:func:`strict_json`) and read back by :func:`float_field`.

Nothing here unpickles: the raw snapshot is written for the user's viewer and never read.

Public API: the file names, :func:`read_jsonl`, :class:`Loaded`, :func:`append_jsonl`,
:func:`cut_partial_line`, :func:`write_text`, :func:`write_bytes`, :func:`write_stream`,
:func:`write_text_stream`, :func:`write_json`, :func:`write_pickle`, :func:`read_json`, :func:`run_folder_of`,
:func:`strict_json`, :func:`float_field`, :class:`RunLock`, :class:`FolderInUse`, :func:`live_holder`.
"""
from __future__ import annotations

import errno
import html
import io
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Generic, TextIO, TypeVar

from fusedce_profiler.instrument import confined, scrub, staging
from fusedce_profiler.instrument.text import capped_strings, printable
from fusedce_profiler.instrument.runlock import LOCK_FILE, FolderInUse, RunLock, live_holder  # noqa: F401 - the lock

RESULTS_FILE = "results.jsonl"
MODEL_RESULTS_FILE = "model_results.jsonl"
FIT_FILE = "fit.json"
PARITY_FILE = "parity.json"
DOCTOR_FILE = "doctor.json"
EXPLAIN_FILE = "explain.json"
EXPLAIN_STEPS_FILE = "explain_steps.jsonl"
ENVIRONMENT_FILE = "environment.json"
PLAN_FILE, MODEL_PLAN_FILE = "plan.json", "model_plan.json"  # the cells of a grid, the jobs of a model run
SNAPSHOTS_DIR = "snapshots"
LOGS_DIR = "logs"
PLOTS_DIR = "plots"
TIMELINE_SUFFIX = ".timeline.json"
SNAPSHOT_SUFFIX = ".pickle"
RECORDED_STEPS_FILE = "recorded_steps.jsonl"
RESULT_FILES = (RESULTS_FILE, MODEL_RESULTS_FILE, PARITY_FILE, DOCTOR_FILE, EXPLAIN_FILE, EXPLAIN_STEPS_FILE,
                RECORDED_STEPS_FILE)
"""The files a run stores its results in, one per kind of run (a folder without any holds no result)."""

T = TypeVar("T")

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
    lines: list[int] = field(default_factory=list)  # the line number of each record
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


def read_jsonl(path: str | Path, parse: Callable[[dict], T], inside: str | Path | None = None) -> Loaded[T]:
    """Every readable record of a JSON-lines file, and what could not be read (see above).

    ``parse`` turns one decoded JSON object into a record; it raises ``ValueError``,
    ``TypeError`` or ``KeyError`` for a row whose fields do not validate. The file is streamed
    from inside the folder ``inside`` (default: its own) under the rules of
    :mod:`fusedce_profiler.instrument.confined` (no link, a size limit, bounded lines and nesting).
    """
    path = Path(path)
    loaded: Loaded[T] = Loaded(path)
    try:
        lines = confined.jsonl_lines(path, inside)
        for number, raw, unterminated in lines:
            if not raw.strip():
                continue
            try:
                obj = confined.loads(raw, f"{path}:{number}")
                if not isinstance(obj, dict):
                    raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
                loaded.records.append(parse(obj))
                loaded.lines.append(number)
            except (ValueError, TypeError, KeyError) as exc:
                reason = f"not a valid row ({_without_path(exc, path, number)})"
                if unterminated:
                    reason = f"a last line cut short by an interrupted write ({_without_path(exc, path, number)})"
                loaded.skipped.append(LineProblem(number, reason))
    except FileNotFoundError:
        loaded.missing = True
    return loaded


def _without_path(exc: Exception, path: Path, number: int) -> str:
    return str(exc).removeprefix(f"{path}:{number}: ")


def cut_partial_line(path: str | Path) -> bool:
    """Cut an unterminated last line (a write interrupted by a kill) before appending.

    Returns whether anything was cut, so the caller can say so. The file is opened without
    following a link (a linked or hard-linked file is refused, never truncated) and only its tail is read.
    """
    path = Path(path)
    try:
        fd = confined.open_inside(path.parent, path, os.O_RDWR | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        end, block = size, 1 << 16
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return False
        while end > 0:
            start = max(0, end - block)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                os.ftruncate(fd, start + newline + 1)
                return True
            end = start
        os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


def run_folder_of(path: str | Path) -> Path:
    """The run folder a file of it belongs to: its own folder, or the one above when that is the
    run's ``snapshots/``, ``logs/`` or ``plots/``."""
    folder = Path(path).parent
    return folder.parent if folder.name in (SNAPSHOTS_DIR, LOGS_DIR, PLOTS_DIR) else folder


def _names(path: Path) -> scrub.Names:
    return scrub.machine_names(run_folder_of(path))


class FileFull(ValueError):
    """A line not appended because the file would then be more than its reader reads
    (:func:`~fusedce_profiler.instrument.confined.size_limit`, :data:`~fusedce_profiler.instrument.confined.MAX_LINES`)."""


def count_lines(path: str | Path) -> int:
    """How many lines the folder's own file ``path`` holds (0 when it is missing), streamed
    under the reader's rules (a link or an oversized file is refused)."""
    try:
        return sum(1 for _ in confined.jsonl_lines(path))
    except FileNotFoundError:
        return 0


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a line, flushed and fsync'ed (a kill loses at most this line).

    The record's strings are scrubbed of the machine's names and cut at :data:`~fusedce_profiler.instrument.text.MAX_STORED_CHARS`.
    The file is opened without following a link (``OSError`` ``ELOOP`` naming it); a new file follows
    the umask. A line that would take the file over its size limit is not written (:class:`FileFull`
    naming the file and the limit): a folder never holds what its reader refuses."""
    path = Path(path)
    line = (dumps(scrub.scrub_value(capped_strings(record), _names(path)), sort_keys=True) + "\n").encode("utf-8")
    confined.check_locked_ancestors(path)  # the run's folder moved or replaced: refused
    fd = confined.open_own_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, path)  # nor a hard link or pipe
    limit = confined.size_limit(path)
    if os.fstat(fd).st_size + len(line) > limit or len(line) > confined.MAX_LINE_BYTES:
        os.close(fd)
        raise FileFull(f"{path}: full: one more line ({len(line):,} bytes) would take it over its reader's limit "
                       f"({limit:,} bytes, {confined.MAX_LINE_BYTES:,} a line)")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise _naming(exc, path) from None


_LINK_REFUSED = confined.WRITE_LINK_REFUSED


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise OSError(errno.ELOOP, _LINK_REFUSED, str(path))


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` when it names no file itself (a failed ``write`` or ``fsync``)."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text``, scrubbed of the machine's names, to ``path`` atomically: a temporary file
    in the same folder, then a rename.

    A failed write leaves the old file as it was; a symbolic link at ``path`` is replaced by
    the new file (the file it pointed to is untouched).
    """
    path = Path(path)
    return write_bytes(path, _scrub_for(path, text, _names(path)).encode("utf-8"))


def _scrub_for(path: Path, text: str, names: scrub.Names) -> str:
    """``text`` scrubbed, its control characters spelled out (a report is read in a terminal
    too: :func:`~fusedce_profiler.instrument.text.printable`); in an HTML page a placeholder is
    written as text (``&lt;cwd&gt;``), not as a tag the browser would hide."""
    if path.suffix in (".html", ".htm"):
        names = tuple((name, html.escape(placeholder)) for name, placeholder in names)
    return scrub.scrub_text(printable(text), names)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Binary form of :func:`write_text`, for images: written as given, not scrubbed."""
    return write_stream(path, lambda fh: fh.write(data))


def write_stream(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """:func:`write_text` of what ``write`` writes into the binary file it is given (a large
    file is streamed, never held whole in memory). A linked parent folder is refused; the file
    follows the umask."""
    path = Path(path)
    confined.check_locked_ancestors(path)  # the run's folder moved or replaced: nothing made through its path
    staging.make_folder(path.parent)
    _refuse_link(path.parent)  # a linked plots/ or snapshots/ would take the file out of the folder
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # no inode left, no permission: the message names the file, not a temporary never made
        exc.filename = str(path)
        raise
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; a run folder's files follow the umask
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        staging.place(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename in (None, tmp):
            exc.filename = str(path)  # name the file being written, not its temporary
        raise
    return path


def write_text_stream(path: str | Path, write: Callable[[TextIO], object]) -> Path:
    """:func:`write_stream` of text: ``write`` writes into a UTF-8 text file whose every complete
    line is scrubbed of the machine's names on its way to disk (a large table is streamed)."""
    path = Path(path)
    names = _names(path)

    def binary(fh: BinaryIO) -> None:
        lines = _ScrubbedLines(fh, lambda text: _scrub_for(path, text, names))
        write(lines)
        lines.close()

    return write_stream(path, binary)


class _ScrubbedLines(io.TextIOBase):
    """A text file writing into ``raw`` whole lines at a time, each through ``scrub`` (a name
    never spans a newline, so none is split between two writes)."""

    def __init__(self, raw: BinaryIO, scrub_text: Callable[[str], str]) -> None:
        self._raw, self._scrub, self._pending = raw, scrub_text, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        cut = self._pending.rfind("\n") + 1
        if cut:
            self._raw.write(self._scrub(self._pending[:cut]).encode("utf-8"))
            self._pending = self._pending[cut:]
        return len(text)

    def close(self) -> None:
        if self._pending:
            self._raw.write(self._scrub(self._pending).encode("utf-8"))
            self._pending = ""
        super().close()


def write_json(path: str | Path, value: Any) -> Path:
    """Strict JSON, indented, its strings scrubbed of the machine's names (and cut at
    :data:`~fusedce_profiler.instrument.text.MAX_STORED_CHARS`), written atomically."""
    path = Path(path)
    text = dumps(scrub.scrub_value(capped_strings(value), _names(path)), indent=1, sort_keys=True) + "\n"
    return write_bytes(path, text.encode("utf-8"))


def write_pickle(path: str | Path, value: Any) -> Path:
    """``value`` (an allocator snapshot: dicts, lists, strings, numbers) pickled, its strings
    scrubbed of the machine's names (a frame's file name), written atomically. The tool writes
    pickles for PyTorch's memory viewer and never reads one."""
    import pickle

    path = Path(path)
    return write_bytes(path, pickle.dumps(scrub.scrub_value(value, _names(path))))


def present(path: str | Path) -> bool:
    """Whether anything is at ``path``: a run file counts as there when its name is taken at all. A link,
    a pipe or a folder in its place is then read, and refused, as such (:func:`read_json`); taken for
    absent, it would silently drop what the file says (a cut run's plan or mark, a fit's result)."""
    return os.path.lexists(path)


def read_json(path: str | Path, inside: str | Path | None = None) -> Any:
    """A JSON file of a run folder, read under the rules of :mod:`fusedce_profiler.instrument.confined`
    from inside the folder ``inside`` (default: its own): ``ValueError`` naming the file when it
    is not JSON, :class:`~fusedce_profiler.instrument.confined.FolderRefused` for a link, a file
    over its size limit or nested too deeply."""
    return confined.loads(confined.read_bytes(path, inside), path)


def _umask() -> int:
    """This process's file-mode creation mask (read without changing it where Linux says it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
