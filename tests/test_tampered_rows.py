"""Rows of valid JSON and valid types whose content the writer never stores: the same cell twice,
a finished cell without its measurements, values outside what the writer guarantees, a log path
leading out of the folder. Each is named in the report by its line, never taken silently."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fusedce_profiler.grid.runner import load_results
from fusedce_profiler.instrument import store
from fusedce_reports import build_report
from processes import cli_env, run_cli

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

GRID = Path(__file__).resolve().parents[1] / "examples" / "default-report-cpu"


@pytest.fixture
def run(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(GRID, copy)
    return copy


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / store.RESULTS_FILE).read_text().splitlines()]


def _store(folder: Path, rows: list[dict]) -> None:
    (folder / store.RESULTS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))


def _tampered(folder: Path, change) -> str:
    """The reason ``results.jsonl`` gives for its second row once ``change`` altered it."""
    rows = _rows(folder)
    change(rows[1])
    _store(folder, rows)
    loaded = load_results(folder)
    assert [p.line for p in loaded.skipped] == [2] and len(loaded.records) == len(rows) - 1
    return loaded.skipped[0].reason


def _set(path: str, value):
    def change(row):
        *parents, last = path.split(".")
        for key in parents:
            row = row[key]
        row[last] = value
    return change


@pytest.mark.parametrize("path, value, reason", [
    ("peak_step_bytes", None, "status 'ok' without its measurements (peak_step_bytes empty)"),
    ("time_ms", None, "status 'ok' without its measurements (time_ms empty)"),
    ("peak_forward_bytes", -5, "peak_forward_bytes must be at least 0"),
    ("spec.ignore_frac", 1.5, "spec.ignore_frac must be in [0, 1)"),
    ("spec.label_smoothing", -0.1, "spec.label_smoothing must be in [0, 1)"),
    ("spec.z_loss", -1.0, "spec.z_loss must be at least 0"),
    ("spec.softcap", 0.0, "spec.softcap must be positive"),
    ("spec.mode", "fp64", "spec.mode must be one of"),
    ("parity.grad_weight", -0.5, "parity.grad_weight must be at least 0"),
    ("log_path", "../../../etc/passwd", "log_path must be a file of the run's logs/ folder"),
    ("log_path", "/etc/passwd", "log_path must be a file of the run's logs/ folder"),
    ("log_path", "logs/../../x.log", "log_path must be a file of the run's logs/ folder"),
    ("time_ms", "Infinity", "time_ms must be a time from 0 to 604800000 ms, got inf"),
    ("time_ms", "NaN", "time_ms must be a time from 0 to 604800000 ms, got nan"),
    ("time_ms", 1e308, "time_ms must be a time from 0 to 604800000 ms"),
    ("time_ms_min", "Infinity", "time_ms_min must be a time"),
    ("times_ms", [1.0, "Infinity"], "times_ms must be a time"),
    ("spec.tokens", 2**63 - 1, "spec.tokens must be at most 2,147,483,647"),
    ("spec.vocab", 2**31, "spec.vocab must be at most 2,147,483,647"),
])
def test_a_row_the_writer_never_stores_is_invalid_naming_its_line(run, path, value, reason):
    assert reason in _tampered(run, _set(path, value))


def test_a_log_path_of_the_runs_logs_folder_is_kept(run):
    rows = _rows(run)
    rows[1].update(status="error", message="RuntimeError: boom", log_path="logs/worker-1-2.log")
    _store(run, rows)
    assert load_results(run).records[1].log_path == "logs/worker-1-2.log"


def test_the_same_cell_twice_is_named_with_both_lines_and_the_last_reported(run):
    rows = _rows(run)
    later = dict(rows[0], time_ms=rows[0]["time_ms"] * 2)
    _store(run, [*rows, later])
    report = build_report(run)
    note = f"{run / store.RESULTS_FILE}: lines 1, {len(rows) + 1} hold the same cell; the last, line {len(rows) + 1}, is reported"
    assert note in report.notes
    shown = f"lines 1, {len(rows) + 1} hold the same cell; the last, line {len(rows) + 1}, is reported"
    assert shown in " ".join(report.summary.read_text().split())


def test_report_of_a_tampered_row_names_it_and_keeps_the_others(run):
    rows = _rows(run)
    rows[1]["peak_step_bytes"] = None
    _store(run, rows)
    result = run_cli(["report", str(run)], cli_env())
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert f"{store.RESULTS_FILE}:2: not a valid row (status 'ok' without its measurements" in result.stdout


def test_a_stored_field_name_with_a_newline_forges_no_line_of_the_output(run):
    rows = _rows(run)
    rows[0]["spec"]["x\nReport: FORGED every cell passed\n"] = 1
    _store(run, rows)
    result = run_cli(["report", str(run)], cli_env())
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert not any(line.startswith("Report: FORGED") for line in result.stdout.splitlines()), result.stdout
    assert "spec has unknown field(s) 'x\\nReport: FORGED every cell passed\\n'" in result.stdout


def test_a_folder_holding_two_kinds_of_records_says_which_one_it_reports(run):
    """A folder holding a grid's and a model run's records was reported as a grid, the model's
    records ignored without a word."""
    model = GRID.parent / "model" / "model-tied"
    shutil.copy(model / store.MODEL_RESULTS_FILE, run / store.MODEL_RESULTS_FILE)
    result = run_cli(["report", str(run)], cli_env())
    assert result.returncode == 0, result.stderr
    assert (f"note: {run} holds the records of more than one run ({store.RESULTS_FILE}, {store.MODEL_RESULTS_FILE}); "
            f"only {store.RESULTS_FILE}'s is reported") in " ".join(result.stdout.split())


@pytest.mark.parametrize("plan", ['{"cells": 3}', '[1, 2]', '{"cells": [{"backend": 1}]}'])
def test_a_plan_that_cannot_be_read_is_named_instead_of_dropped(run, plan):
    """A damaged ``plan.json`` was read as "no plan": the report then could not say whether the run
    had measured every cell it set out to, and did not say that it could not."""
    (run / store.PLAN_FILE).write_text(plan)
    report = build_report(run)
    note = [n for n in report.notes if n.startswith(f"{run / store.PLAN_FILE}: not a plan of cells")]
    assert note and note[0].endswith("whether the run measured every cell it planned is unknown"), report.notes


def test_a_plan_of_more_cells_than_a_run_plans_is_named_instead_of_read(run):
    """A grid refuses to plan more than ``MAX_CELLS`` cells; a ``plan.json`` holding more was read
    whole and the report suggested a ``--resume`` that the grid would refuse."""
    from fusedce_profiler.instrument.capacity import MAX_CELLS

    (run / store.PLAN_FILE).write_text(json.dumps({"cells": [{}] * (MAX_CELLS + 1)}))
    report = build_report(run)
    note = [n for n in report.notes if n.startswith(f"{run / store.PLAN_FILE}: not a plan of cells")]
    assert note and f"{MAX_CELLS + 1:,} cells, more than the {MAX_CELLS:,} a run plans" in note[0], report.notes
