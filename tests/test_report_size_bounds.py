"""A model or recorded-steps report of a file of many rows stays the size of a few.

A ``recorded_steps.jsonl`` of 20,000 rows (inside every file limit) took
18.8 GB and did not finish, and a ``model_results.jsonl`` of 1,600 jobs 1.5 GB and a 10 MB PNG,
because each figure was as tall as the rows it drew and each table and finding listed every row.
The pages now draw at most a fixed number of rows and say which they left out; the stored file
keeps them all. Each test renders a folder of far more rows than that and checks the sizes, the
figures' heights and the sentence.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.step.jobs import ModelResult
from fusedce_reports.model_report import write_model_report
from fusedce_reports.recorded_report import write_recorded_report
from test_model_report import GIB, _result
from test_recorded_report import MIB, _record

ROWS = 200
"""Rows of each big folder: five times the most a page shows (40), few enough to write fast."""
#: Bounds far above what 40 rows take and far below what 200 rows took before (1,000 recorded
#: steps: summary.md 0.99 MB, phases.png 12.6 MB; 1,600 jobs: breakdown.png 10 MB).
MAX_SUMMARY_BYTES = 120_000
MAX_PNG_BYTES = 1_500_000
MAX_FIGURE_INCHES = 31
"""The tallest bars figure of 40 rows: 0.7 inch a bar and 2 inches of title and legend."""


def _write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _png_height_inches(path: Path, dpi: float) -> float:
    """The PNG's height in inches at ``dpi`` (read from its IHDR chunk)."""
    return int.from_bytes(path.read_bytes()[20:24], "big") / dpi


def _recorded_folder(folder: Path, rows: int) -> Path:
    record = _record([], reserved_at_start=900 * MIB, peak_reserved=2100 * MIB)
    _write_lines(folder / store.RECORDED_STEPS_FILE,
                 [dataclasses.replace(record, step=i).to_dict() for i in range(rows)])
    return folder


def _model_folder(folder: Path, rows: int) -> Path:
    results = [_result("torch", 20 * GIB, 10 * GIB)] + [_result(f"pkg.mod:f{i}", 11 * GIB, GIB)
                                                         for i in range(1, rows)]
    _write_lines(folder / store.MODEL_RESULTS_FILE, [dataclasses.asdict(r) for r in results])
    assert ModelResult.from_dict(dataclasses.asdict(results[1])) == results[1]
    return folder


def test_a_recorded_folder_of_many_steps_shows_the_last_ones_and_says_so(tmp_path):
    folder = _recorded_folder(tmp_path / "many", ROWS)
    page = write_recorded_report(folder).read_text()
    assert len(page.encode()) < MAX_SUMMARY_BYTES
    said = " ".join(page.split())
    assert f"showing 40 of {ROWS} recorded steps: the last 40; recorded_steps.jsonl holds them all" in said
    assert f"step {ROWS - 1}" in page and f"step {ROWS - 41} " not in page and "| step 0 " not in page
    assert "Showing 40 of these steps' 80 phases: the last 40" in said
    phases = folder / store.PLOTS_DIR / "phases.png"
    assert phases.stat().st_size < MAX_PNG_BYTES
    assert _png_height_inches(phases, 110) < MAX_FIGURE_INCHES
    for png in (folder / store.PLOTS_DIR).glob("*.png"):
        assert png.stat().st_size < MAX_PNG_BYTES, png.name
    # the stored file is left whole
    assert len((folder / store.RECORDED_STEPS_FILE).read_text().splitlines()) == ROWS


def test_a_model_folder_of_many_jobs_shows_the_first_ones_and_says_so(tmp_path):
    folder = _model_folder(tmp_path / "many", ROWS)
    page = write_model_report(folder).read_text()
    assert len(page.encode()) < MAX_SUMMARY_BYTES
    said = " ".join(page.split())
    assert f"showing 40 of {ROWS} jobs: the first 40; model_results.jsonl holds them all" in said
    assert "torch peaks at 20.0 GiB" in said  # the reference, measured first, is among those shown
    assert "pkg.mod:f39" in page and "pkg.mod:f40" not in page
    for name in ("breakdown.png", "reserved.png"):
        png = folder / store.PLOTS_DIR / name
        assert png.stat().st_size < MAX_PNG_BYTES, name
        assert _png_height_inches(png, 120) < MAX_FIGURE_INCHES, name
    assert len((folder / store.MODEL_RESULTS_FILE).read_text().splitlines()) == ROWS


def test_the_model_plots_bound_their_own_bars(tmp_path):
    """Called with every row (as a library user may), a plot still draws a bounded figure and its
    title says how many it left out."""
    from fusedce_reports.plots.model import draw_breakdown, draw_reserved

    results = [_result("torch", 20 * GIB, 10 * GIB)] + [_result(f"pkg.mod:f{i}", 11 * GIB, GIB)
                                                         for i in range(1, ROWS)]
    for draw in (draw_breakdown, draw_reserved):
        fig = draw(results)
        assert fig.get_size_inches()[1] < MAX_FIGURE_INCHES, draw.__name__
        assert f"(the first 40 of {ROWS})" in fig.axes[0].get_title(), draw.__name__
        assert len(fig.axes[0].get_yticks()) == 40, draw.__name__


def test_small_folders_leave_nothing_out(tmp_path):
    recorded = write_recorded_report(_recorded_folder(tmp_path / "recorded", 3)).read_text()
    model = write_model_report(_model_folder(tmp_path / "model", 3)).read_text()
    for page in (recorded, model):
        assert "showing" not in page.lower() and "holds them all" not in page
    assert "step 0" in recorded and "step 2" in recorded
    assert "pkg.mod:f1" in model and "pkg.mod:f2" in model
