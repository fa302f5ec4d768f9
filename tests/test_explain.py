"""explain: hypotheses from measured calibration steps, ranked against the readings (CPU)."""
import dataclasses

import pytest

from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.judgements.explain import records as ex
from fusedce_profiler.judgements.explain import calibration as ex_cal
from fusedce_profiler.judgements.explain import conclusion as ex_con
from fusedce_profiler.judgements.explain import verdict as ex_ver
from fusedce_profiler.instrument.step.jobs import ModelJob, run_jobs

MIB = 1 << 20


@pytest.fixture(scope="module")
def calibrations():
    base = ModelJob(get_preset("tiny"), "torch", 1, 64, device="cpu", trace=False)
    obs = ex.Observation(10, 10, 24, tied=False, eval_step=False, checkpointing=False, seq=64)
    families = ex_cal.enumerate_families(obs, attention_impls=("eager", "sdpa"), tie_choices=(False,),
                                         seq_candidates=(64,))
    return ex_cal.calibrate(base, families, ("torch", "fusedce"), (1, 3), run_jobs)


def test_calibration_is_measured_and_grows_with_batch(calibrations):
    assert len(calibrations) == 4 and all(c.slope and c.slope > 0 for c in calibrations)


@pytest.mark.parametrize("attention, active", [("eager", True), ("sdpa", False)])
def test_a_planted_configuration_ranks_first_from_its_own_predicted_numbers(calibrations, attention, active):
    fam = ex.Family(attention, False, False, False, 64)
    naive = next(c for c in calibrations if c.family == fam and c.backend == "torch")
    fused = next(c for c in calibrations if c.family == fam and c.backend == "fusedce")
    planted_b = 6
    n = naive.predict(planted_b)
    f = fused.predict(planted_b) if active else n
    obs = ex.Observation(n / MIB, f / MIB, 24, tied=False, eval_step=False, checkpointing=False, seq=64,
                         tolerance=0.01)
    ranked = ex_ver.build_hypotheses(obs, calibrations)
    best = ranked[0]
    assert (best.family, best.batch, best.fused_active) == (fam, planted_b, active)
    assert best.consistent and best.score < 1e-9
    decided, conclusion = ex_con.conclude(ranked, obs)
    assert conclusion


def test_cannot_decide_is_said_and_a_separating_run_is_named_when_both_fit(calibrations):
    fam = ex.Family("sdpa", False, False, False, 64)
    naive = next(c for c in calibrations if c.family == fam and c.backend == "torch")
    obs = ex.Observation(naive.predict(6) / MIB, naive.predict(6) / MIB * 0.97, 24, tied=False, eval_step=False,
                         checkpointing=False, seq=64, tolerance=0.5)
    ranked = ex_ver.build_hypotheses(obs, calibrations)
    decided, conclusion = ex_con.conclude(ranked, obs)
    assert not decided and "Cannot decide" in conclusion
    assert "still open: fused path NOT active or fused path active" in conclusion
    sep = ex_con.separating_measurement(ranked, obs, "--preset tiny")
    assert sep is not None and sep.dimension == "fused_active" and "fusedce-profile model --preset tiny" in sep.command


def test_explanation_round_trips_through_its_json_and_renders(calibrations, tmp_path):
    from fusedce_reports.explain_report import write_explain_report

    obs = ex.Observation(3, 2.9, 24, seq=64)
    ranked = ex_ver.build_hypotheses(obs, calibrations)
    decided, conclusion = ex_con.conclude(ranked, obs)
    e = ex.Explanation(obs, "builtin:tiny", None, "cpu", "peak allocated bytes (CPU)", calibrations, ranked,
                       ex_con.separating_measurement(ranked, obs, "--preset tiny"), decided, conclusion, False,
                       ["on the CPU"])
    ex.save_explanation(tmp_path, e)
    assert ex.load_explanation(tmp_path).hypotheses == ranked
    text = write_explain_report(tmp_path).read_text()
    assert "Calibration steps (measured)" in text and "Not confirmed" in text


def test_explain_command_writes_its_folder_and_report_rebuilds_it(tmp_path):
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    out = tmp_path / "ex"
    runner = CliRunner()
    result = runner.invoke(app, ["explain", "--device", "cpu", "--preset", "tiny", "--naive", "3.2", "--fused", "2.9",
                                 "--card", "24", "--seq", "32", "--attention", "sdpa", "--untied",
                                 "--no-checkpointing", "--no-eval-step", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert (out / "explain.json").is_file() and "could not" in (out / "summary.md").read_text() or \
        "Not confirmed" in (out / "summary.md").read_text()
    (out / "summary.md").unlink()
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert (out / "summary.md").is_file()


def test_explain_report_escapes_the_stored_model_backend_and_notes(calibrations):
    from fusedce_reports.explain_report import render_explain_markdown

    obs = ex.Observation(3, 2.9, 24, seq=64, fused_backend="my|loss*`x`:make")
    ranked = ex_ver.build_hypotheses(obs, calibrations)
    decided, conclusion = ex_con.conclude(ranked, obs)
    e = ex.Explanation(obs, "pkg.mod:build|*", None, "cpu", "peak allocated bytes (CPU)", calibrations, ranked,
                       None, decided, conclusion, False, ["note with | and *"])
    text = render_explain_markdown(e, {"torch": "x ```` y"})
    assert r"my\|loss\*\`x\`:make" in text and r"pkg.mod:build\|\*" in text and r"note with \| and \*" in text
    assert "my|loss" not in text and "`````" in text
    assert text.startswith("# fusedce-profile explain: 3 → 2.9 MiB on a 24 GiB card")


def test_the_conclusion_names_the_values_the_readings_rule_out(calibrations):
    fam = ex.Family("eager", False, False, False, 64)
    naive = next(c for c in calibrations if c.family == fam and c.backend == "torch")
    fused = next(c for c in calibrations if c.family == fam and c.backend == "fusedce")
    obs = ex.Observation(naive.predict(6) / MIB, fused.predict(6) / MIB, 24, tied=False, eval_step=False,
                         checkpointing=False, seq=64, tolerance=0.01)
    ranked = ex_ver.build_hypotheses(obs, calibrations)
    summary = ex_con.dimension_summary(ranked)
    assert "every consistent hypothesis has fused path active, attention eager" in summary
    assert "ruled out (no consistent hypothesis has it): fused path NOT active, attention sdpa" in summary
    assert ex_con.dimension_summary([dataclasses.replace(h, consistent=False) for h in ranked]) == ""


def _hypothesis(batch, fused_active, predicted, measured_naive=None, measured_fused=None):
    family = ex.Family("sdpa", True, True, False, 1024)
    return ex.Hypothesis(family, batch, fused_active, predicted, predicted * (0.6 if fused_active else 1.0), 0.0,
                         0.0, True, "", measured_naive, measured_fused)


def test_a_full_size_step_that_contradicts_the_calibration_is_named():
    gib = 2**30
    hypotheses = [
        _hypothesis(54, False, 22 * gib, measured_naive=33 * gib, measured_fused=7 * gib),  # +50%: a miss
        _hypothesis(12, True, 20 * gib, measured_naive=int(20.5 * gib), measured_fused=int(12.1 * gib)),  # within 5%
        _hypothesis(30, True, 21 * gib),  # never measured at full size
    ]
    misses = ex_ver.calibration_misses(hypotheses, 0.05)
    assert len(misses) == 1
    assert misses[0].startswith("torch at B=54, sdpa, tied, checkpointing") and "(+50%)" in misses[0]
    # the fused figure of a "not active" hypothesis is torch's: it is never judged against the fused prediction
    assert not any(m.startswith("the fused loss at B=54") for m in misses)


def test_the_report_says_when_the_calibration_failed_at_full_size():
    from fusedce_reports.explain_report import render_explain_markdown

    gib = 2**30
    obs = ex.Observation(22785, 22155, 24)
    missed = _hypothesis(54, False, 22 * gib, measured_naive=33 * gib, measured_fused=7 * gib)
    explanation = ex.Explanation(observation=obs, model="builtin:user-gpt", source={}, device="cuda",
                                 metric="nvidia-smi", calibrations=[], hypotheses=[missed], separation=None,
                                 decided=True, conclusion="Decided.", confirmed=True, notes=[])
    page = render_explain_markdown(explanation)
    assert "**Not decided.**" in page and "The calibration does not hold at full size" in page
    assert "predicted 22,528 MiB, measured 33,792 MiB (+50%)" in page
