"""The terse summary table on the terminal (rendered as text at 80 and 120 columns) and the progress bar."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from fusedce_profile.console import CellProgress, summary_tables
from planted import cell, frame

COLUMNS = ("back-end", "tokens", "peak extra", "× floor", "saving vs torch", "time", "parity")


def _render(cells, width: int) -> str:
    console = Console(record=True, width=width, color_system=None, highlight=False)
    for table in summary_tables(frame(*cells)):
        console.print(table)
    return console.export_text()


def _rows(text: str) -> dict[tuple[str, str], str]:
    """(back-end, tokens) → the rest of its line (the wrapped saving's second line dropped)."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1][0].isdigit():
            rows[(parts[0], parts[1])] = " ".join(parts[2:])
    return rows


GRID = [
    cell("torch", 1024, 100, time_ms=4.0, floor_mib=1),
    cell("fusedce", 1024, 10, time_ms=2.0, floor_mib=1),
    cell("torch", 4096, None, status="oom", floor_mib=4),
    cell("fusedce", 4096, 40, time_ms=8.0, floor_mib=4, err=0.2),
]


@pytest.mark.parametrize("width", [80, 120])
def test_summary_table_shows_every_column_the_baseline_the_saving_the_oom_row_and_parity(width):
    text = _render(GRID, width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert text.splitlines()[0].strip() == "H=64 V=1000 · amp-bf16 · cuda"
    header = next(line for line in text.splitlines() if "back-end" in line)
    positions = [header.index(column) for column in COLUMNS]
    assert positions == sorted(positions)  # every column, in order
    rows = _rows(text)
    assert rows[("torch", "1k")] == "100 MiB 100.00 baseline 4.00 ms 1.0e-03 ✓"
    assert rows[("fusedce", "1k")].startswith("10.0 MiB 10.00 90.0 MiB")
    assert "(90%)" in text
    assert rows[("torch", "4k")] == "OOM – – – –"
    assert rows[("fusedce", "4k")] == "40.0 MiB 10.00 – 8.00 ms 2.0e-01 ✗"


def test_at_120_columns_the_saving_stays_on_one_line():
    rows = _rows(_render(GRID, 120))
    assert rows[("fusedce", "1k")] == "10.0 MiB 10.00 90.0 MiB (90%) 2.00 ms 1.0e-03 ✓"


def test_a_back_end_name_with_rich_markup_is_shown_as_written():
    text = _render([cell("torch", 1024, 100), cell("evil:[bold]x[/bold]", 1024, 10)], 120)
    assert "evil:[bold]x[/bold]" in text


def test_the_progress_bar_names_the_cell_running_not_the_last_one_finished():
    first, second = cell("torch", 1024, cpu=True), cell("fusedce", 2048, cpu=True)
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    progress = CellProgress(console, total=2)
    with progress.running():
        bar = progress._progress.tasks[0]
        progress.start(first.spec)
        assert bar.description == "torch 1k" and bar.completed == 0
        progress(first)
        progress.start(second.spec)
        assert bar.description == "fusedce 2k" and bar.completed == 1
        progress(second)
        assert bar.completed == 2


def test_emoji_codes_and_markup_in_names_are_shown_as_written(monkeypatch, capsys):
    """``:rocket:`` in a folder's name or ``:factory:`` in ``module:factory:x`` was printed as an
    emoji; markup in an error's text, on a terminal, was obeyed; so was markup in the progress bar."""
    from fusedce_profile.console import error, make_console

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stdout = Terminal()
    monkeypatch.setattr("sys.stdout", stdout)
    make_console(to_stderr=False).print("writing to run:rocket:x and --model mod:factory:f", markup=False)
    assert "writing to run:rocket:x and --model mod:factory:f" in stdout.getvalue()
    stderr = Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    error("--model mod:factory:f [bold]raised[/bold]")
    assert ":factory:f [bold]raised[/bold]" in stderr.getvalue()
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    progress = CellProgress(console, total=1)
    evil = cell("evil:[red]x:rocket:", 1024, cpu=True)
    with progress.running():
        progress.start(evil.spec)
        rendered = Console(file=io.StringIO(), width=100, emoji=False, color_system=None)
        rendered.print(progress._progress)
        assert "evil:[red]x:rocket: 1k" in rendered.file.getvalue()
