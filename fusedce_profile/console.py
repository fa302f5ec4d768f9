"""Terminal output: the terse summary table, progress and messages.

Colours and the progress bar appear only on a terminal (rich's detection, ``NO_COLOR``
respected); piped or captured output gets plain text and one line per finished cell.
With ``--json`` everything human goes to stderr so that stdout holds only the JSON.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from fusedce_profiler.instrument.records import CellResult, CellSpec
from fusedce_profiler.instrument.text import capped, one_line, printable, shorten
from fusedce_profiler.instrument.worker_errors import line_naming_log
from fusedce_reports.units import format_bytes, format_error, format_ms, format_percent, format_tokens, is_missing

if TYPE_CHECKING:
    import pandas as pd


class Printer(Protocol):
    """Where a command's lines go: a rich ``Console``, or anything with its ``print`` (the report
    command holds a rebuilt report's lines until its files are in place)."""

    def print(self, *objects: Any, **options: Any) -> None: ...


PIPED_WIDTH = 120


def shown(text: str) -> str:
    """``text`` as the terminal shows it: an escape sequence or a bidirectional override from the
    user's code or a stranger's folder spelled out, not obeyed
    (:func:`~fusedce_profiler.instrument.text.printable`), and no line longer than
    :data:`~fusedce_profiler.instrument.text.MAX_SHOWN_CHARS` (:func:`~fusedce_profiler.instrument.text.capped`)."""
    return printable(capped(text))


class _PrintableConsole(Console):
    """A rich console that passes every string it renders (a message, a table cell) through
    :func:`shown`."""

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(shown(text), **kwargs)


class _UntilReaderLeaves:
    """A text stream that writes into ``stream`` until its reader goes away (``| head -1`` exits) or
    it cannot be written (``>/dev/full``, a full disk): from then on the stream's descriptor points at
    the null device and what is printed is dropped, so a lost output stops the printing, never the
    run (which goes on writing its folder). A write error other than a closed pipe is said once on
    stderr."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _output_lost(self, exc: OSError) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())  # every later write, the interpreter's too, goes nowhere
            os.close(null)
        except (OSError, ValueError):
            pass
        if not isinstance(exc, BrokenPipeError) and self._stream is not sys.stderr:
            try:
                sys.stderr.write(f"fusedce-profile: the standard output cannot be written ({exc.strerror or exc}); "
                                 "the run goes on without it\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BlockingIOError:  # a descriptor someone made non-blocking, full for now: this text only is lost
            return len(text)
        except OSError as exc:
            self._output_lost(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BlockingIOError:
            pass
        except OSError as exc:
            self._output_lost(exc)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def make_console(*, to_stderr: bool) -> Console:
    """A rich console on stdout (or stderr), colours only when it is a terminal; control
    characters of what it prints are spelled out, and a reader that goes away stops the printing
    only (:class:`_UntilReaderLeaves`)."""
    stream = _UntilReaderLeaves(sys.stderr if to_stderr else sys.stdout)
    # Piped output (a log file) gets a fixed width wide enough for the tables, unless
    # COLUMNS says otherwise.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH
    return _PrintableConsole(file=stream, highlight=False, soft_wrap=True, width=width, emoji=False)


def error(message: str) -> None:
    """Print an error message to stderr (red on a terminal; one unwrapped line otherwise): one line,
    its newlines spelled out (:func:`~fusedce_profiler.instrument.text.one_line`)."""
    message = one_line(capped(message))
    try:  # an error output that cannot be written (``2>/dev/full``) changes nothing of the exit code
        if not sys.stderr.isatty():
            sys.stderr.write(f"error: {message}\n")
            sys.stderr.flush()
            return
        from rich.markup import escape

        # the message is text as written: no markup of its own, no ":name:" read as an emoji
        Console(file=sys.stderr, highlight=False, soft_wrap=True, emoji=False).print(
            f"[bold red]error:[/] {escape(message)}", markup=True)
    except OSError:
        pass


def _cell_line(done: int, total: int | None, result: CellResult, out_dir: Path | None = None) -> str:
    spec = result.spec
    head = f"{spec.backend} {format_tokens(spec.tokens)}×{spec.hidden}×{spec.vocab} {spec.mode}"
    if result.status == "ok":
        detail = f"peak {format_bytes(result.peak_step_bytes)}, {format_ms(result.time_ms)}"
    elif result.status == "oom":
        detail = "out of memory"
    else:
        first = result.message.strip().splitlines()[0] if result.message.strip() else ""
        shown = line_naming_log(first, Path(out_dir), 100) if out_dir is not None else shorten(first, 100)
        detail = f"{result.status}: {shown}"  # a log named within the run folder, named from here, whole
        if result.log_path and "; log " not in first:  # the worker's log holds the traceback
            log = Path(out_dir) / result.log_path if out_dir is not None else result.log_path
            detail += f" (traceback in {log})"
    return f"[{done}/{total if total is not None else '?'}] {head}: {detail}"


class CellProgress:
    """Reports finished cells: a progress bar with ETA on a terminal, else one line per cell."""

    def __init__(self, console: Console, total: int | None, out_dir: Path | None = None) -> None:
        self.console, self.total, self.done, self.out_dir = console, total, 0, out_dir
        self._progress: Progress | None = None
        self._task = None
        self._started = time.monotonic()

    @contextmanager
    def running(self) -> Iterator["CellProgress"]:
        if self.console.is_terminal:
            self._progress = Progress(
                # a back-end's name as written: no markup, no emoji
                TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                TextColumn("cells"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=True,
            )
            self._task = self._progress.add_task("profiling", total=self.total)
            with self._progress:
                yield self
        else:
            yield self

    def start(self, spec: CellSpec) -> None:
        """A cell begins: the bar names the cell now running (not the last one finished)."""
        if self._progress is not None:
            self._progress.update(self._task, description=f"{shown(spec.backend)} {format_tokens(spec.tokens)}")

    def __call__(self, result: CellResult) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1)
        else:
            # one line per cell, never wrapped: a log reader greps it
            self.console.print(_cell_line(self.done, self.total, result, self.out_dir), markup=False, soft_wrap=True)


_STATUS_STYLE = {"ok": "", "oom": "yellow", "error": "red", "timeout": "red", "skipped": "dim"}


def _table(title: str, group: pd.DataFrame) -> Table:
    from fusedce_reports.frame import BASELINE_BACKEND

    # Cells and title are Text, never markup: a back-end named "evil:[bold]x" is shown as written.
    table = Table(title=Text(shown(title)), title_justify="left", title_style="bold", header_style="bold",
                  pad_edge=False, box=box.SIMPLE_HEAD, collapse_padding=True)
    for column in ("back-end", "tokens", "peak extra", "× floor", "saving vs torch", "time", "parity"):
        # only the saving may wrap ("2.40 GiB" / "(94%)") in an 80-column terminal
        table.add_column(column, justify="left" if column == "back-end" else "right",
                         no_wrap=column != "saving vs torch")
    for row in group.itertuples():
        peak = format_bytes(row.peak_bytes) if row.status == "ok" else "OOM" if row.status == "oom" else row.status
        if row.status != "ok":
            saving = "–"
        elif row.backend == BASELINE_BACKEND:
            saving = "baseline"
        elif is_missing(row.saving_bytes):
            saving = "–"
        else:
            saving = f"{format_bytes(row.saving_bytes)} ({format_percent(row.saving_frac)})"
        if row.non_finite:  # a NaN loss or gradient: a parity failure
            parity = "NaN ✗"
        elif row.parity_ok is None or is_missing(row.worst_error):
            parity = "–"
        else:
            parity = f"{format_error(row.worst_error)} " + ("✓" if row.parity_ok else "✗")
        style = "red" if row.parity_ok is False else _STATUS_STYLE.get(row.status, "")
        cells = (row.backend, format_tokens(row.tokens), peak,
                 "–" if is_missing(row.x_floor) else f"{row.x_floor:.2f}", saving, format_ms(row.time_ms), parity)
        table.add_row(*(Text(shown(cell)) for cell in cells), style=style)
    return table


def summary_tables(frame: pd.DataFrame) -> list[Table]:
    """One terse table per (device, mode, head, options) group, a row per cell: back-end,
    tokens, peak extra (``OOM`` or the status when it did not run), × floor, saving vs torch
    (``baseline`` on torch's row), time, parity (worst error with ✓ or ✗)."""
    from fusedce_reports.tables import group_title

    return [_table(group_title(d, m, int(h), int(v), o), group)
            for (d, m, h, v, o), group in frame.groupby(["device", "mode", "hidden", "vocab", "options"], sort=False)]
