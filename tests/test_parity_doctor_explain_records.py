"""``parity.json``, ``doctor.json`` and ``explain.json`` as ``report`` reads them.

A parity record without curves, or whose torch curve has no loss or a zero one, was a traceback
(``IndexError``, ``ZeroDivisionError``); it is one line naming the file and the field. 5,000 parity
curves ran past 90 s; more runs than ``parity.json`` holds are refused, and a page lists a bounded
number of back-ends. Losses of ±1.8e308 made the plot fail with "Singular matrix"; what cannot be
drawn is left out of the plot, and the page says so. The doctor and explain pages grew with their
lists; they list the first 200 and count the rest. NaN or negative readings, a spread over -3
batches, were rendered; they are refused naming the field.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest

from fusedce_profiler.instrument import store
from fusedce_profiler.judgements.explain.records import load_explanation
from fusedce_profiler.judgements.parity import load_parity_report, relative_difference
from fusedce_reports.doctor_report import read_doctor, write_doctor_report
from fusedce_reports.explain_report import write_explain_report
from fusedce_reports.parity_report import MAX_CURVES_SHOWN, write_parity_report
from processes import cli_env, run_cli

REPO = Path(__file__).resolve().parents[1]
PARITY = REPO / "examples" / "model" / "parity-cpu-tiny-fp32"
DOCTOR = REPO / "tests" / "fixtures" / "cpu_doctor"
EXPLAIN = REPO / "examples" / "explain" / "user-gpt-22785-22155"


def _folder(tmp_path: Path, example: Path, name: str, change) -> Path:
    """A copy of ``example`` whose ``name`` record ``change`` rewrote (in place, on the parsed JSON)."""
    run = tmp_path / "run"
    shutil.copytree(example, run)
    raw = json.loads((run / name).read_text())
    change(raw)
    (run / name).write_text(json.dumps(raw))
    return run


def _no_curves(raw):
    raw["curves"], raw["verdicts"] = [], []


def _empty_losses(raw):
    for curve in raw["curves"]:
        curve["losses"] = []


def _zero_losses(raw):
    for curve in raw["curves"]:
        curve["losses"] = [0.0] * len(curve["losses"])


@pytest.mark.parametrize("change, field", [(_no_curves, "curves"), (_empty_losses, "curves[0].losses"),
                                           (_zero_losses, "curves[0].losses[0]")],
                         ids=["no-curves", "empty-losses", "zero-losses"])
def test_a_parity_record_the_command_never_writes_is_refused_naming_the_field(tmp_path, change, field):
    run = _folder(tmp_path, PARITY, store.PARITY_FILE, change)
    with pytest.raises(ValueError, match=r"parity\.json: .*" + field.replace("[", r"\[").replace("]", r"\]")):
        load_parity_report(run)


def test_report_of_a_parity_record_without_curves_is_one_line_exit_2(tmp_path):
    run = _folder(tmp_path, PARITY, store.PARITY_FILE, _no_curves)
    result = run_cli(["report", str(run)], cli_env())
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert str(run / store.PARITY_FILE) in line and "curves" in line


def test_a_relative_difference_to_a_zero_reference_is_never_a_division_error():
    assert relative_difference(0.0, 0.0) == 0.0 and relative_difference(1.0, 0.0) == math.inf
    assert relative_difference(1.1, 1.0) == pytest.approx(0.1)


def _many_curves(count: int, steps: int = 200):
    """``count`` back-ends' curves, each the stored fusedce curve cut to ``steps`` steps."""
    def change(raw):
        for curve in raw["curves"]:
            curve["losses"] = curve["losses"][:steps]
        curve, verdict = raw["curves"][-1], raw["verdicts"][-1]
        names = [f"m{i}:f" for i in range(count)]
        raw["curves"] = raw["curves"][:1] + [dict(curve, backend=name) for name in names]
        raw["verdicts"] = [dict(verdict, backend=name) for name in names]
        raw["settings"].update(backends=names, control=False, steps=steps, check_steps=[0, steps - 1])
    return change


def test_more_parity_runs_than_parity_json_holds_are_refused(tmp_path):
    run = _folder(tmp_path, PARITY, store.PARITY_FILE, _many_curves(5000, steps=10))
    with pytest.raises(ValueError, match="settings.backends: 5,001 training runs of 10 steps"):
        load_parity_report(run)


def test_a_parity_page_of_many_back_ends_lists_a_bounded_number_and_says_so(tmp_path):
    run = _folder(tmp_path, PARITY, store.PARITY_FILE, _many_curves(300))
    start = time.perf_counter()
    summary, report = write_parity_report(run)
    assert time.perf_counter() - start < 60
    text = summary.read_text()
    assert len(report.curves) == 301
    assert f"Showing {MAX_CURVES_SHOWN} of 300 back-ends" in text
    assert "m39:f" in text and "m40:f" not in text and len(text) < 60_000


def test_losses_beyond_what_a_plot_spans_are_left_out_of_the_plot_and_said(tmp_path):
    def change(raw):
        raw["curves"][-1]["losses"] = [1.7976931348623157e308, -1.7976931348623157e308] * 100
    run = _folder(tmp_path, PARITY, store.PARITY_FILE, change)
    summary, _ = write_parity_report(run)
    assert "200 stored losses beyond ±1e+100 are not drawn" in summary.read_text()
    assert (run / "plots" / "parity_loss.png").stat().st_size > 0


def test_doctor_and_explain_pages_do_not_grow_with_their_lists(tmp_path):
    def doctor(raw):
        raw["checks"] = [dict(raw["checks"][0], evidence=f"e{i}") for i in range(5000)]
        raw["losses"] = {f"loss {i}": 1.0 for i in range(5000)}

    def explain(raw):
        raw["notes"] = [f"note {i}" for i in range(5000)]
        raw["others"] = [dict(raw["others"][0], name=f"cause {i}") for i in range(5000)]
        raw["calibrations"] = raw["calibrations"][:1] * 2000

    for example, name, change, write in ((DOCTOR, store.DOCTOR_FILE, doctor, write_doctor_report),
                                         (EXPLAIN, store.EXPLAIN_FILE, explain, write_explain_report)):
        run = _folder(tmp_path / name, example, name, change)
        text = write(run).read_text()
        assert len(text.splitlines()) < 1_500 and len(text) < 400_000, name
        assert "Showing 200 of 5,000" in text, name


@pytest.mark.parametrize("example, name, change, message", [
    (EXPLAIN, store.EXPLAIN_FILE, lambda raw: raw["observation"].update(naive_mib=math.nan),
     "observation.naive_mib must be a finite number above 0"),
    (EXPLAIN, store.EXPLAIN_FILE, lambda raw: raw["observation"].update(total_gib=-1.0),
     "observation.total_gib must be a finite number above 0"),
    (DOCTOR, store.DOCTOR_FILE, lambda raw: raw["spread"].update(samples=-3), "spread.samples must be at least 0"),
    (DOCTOR, store.DOCTOR_FILE, lambda raw: raw["spread"].update(tolerance=-math.inf),
     "spread.tolerance must be a number ≥ 0"),
    (DOCTOR, store.DOCTOR_FILE, lambda raw: raw["spread"].update(groups={"w": math.nan}),
     "spread.groups.w must be a number ≥ 0"),
], ids=["explain-nan", "explain-card", "doctor-samples", "doctor-tolerance", "doctor-group"])
def test_a_doctor_or_explain_value_the_writer_never_stores_is_refused_naming_it(tmp_path, example, name, change,
                                                                               message):
    """A NaN reading rendered "nan → -inf MiB on a -1 GiB card"; a spread of -3 samples with NaN
    tolerances rendered as PASS. (An infinite spread is a real one: an overflowing fp16 loss.)"""
    run = _folder(tmp_path, example, name, change)
    reader = load_explanation if name == store.EXPLAIN_FILE else read_doctor
    with pytest.raises(ValueError, match=message) as refused:
        reader(run)
    assert name in str(refused.value) and "\n" not in str(refused.value)
