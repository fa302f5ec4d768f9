"""explain: per-phase predictions from measured steps, joint scoring, refusals, separation, resume (CPU)."""
import json
from pathlib import Path

import pytest

from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.instrument.step.jobs import ModelJob, run_jobs
from fusedce_profiler.judgements.explain import calibration as ex_cal
from fusedce_profiler.judgements.explain import conclusion as ex_con
from fusedce_profiler.judgements.explain import records as ex
from fusedce_profiler.judgements.explain import verdict as ex_ver
from fusedce_profiler.judgements.explain.allocator import DeviceTerms, predict_reading

MIB, GIB = 1 << 20, 1 << 30
QUICK = ["--device", "cpu", "--preset", "tiny", "--seq", "32", "--attention", "sdpa", "--untied",
         "--no-checkpointing", "--no-eval-step"]


def _calibrate(family, backend, batches):
    base = ModelJob(get_preset("tiny"), "torch", 1, family.seq, device="cpu", trace=False)
    jobs = [ex_cal.family_job(base, family, backend, b) for b in batches]
    return ex_cal.calibration_from_results(family, backend, list(batches), run_jobs(jobs))


@pytest.mark.parametrize("attention, backend", [("eager", "torch"), ("sdpa", "fusedce")])
def test_per_phase_lines_predict_cpu_steps_at_batch_sizes_they_were_not_calibrated_on(attention, backend):
    family = ex.Family(attention, False, False, False, 64)
    cal = _calibrate(family, backend, (2, 4))
    assert set(cal.lines) == set(ex.PHASES)
    measured = _calibrate(family, backend, (6, 9))
    for b, peak in zip(measured.batches, measured.figures):
        predicted, phase = cal.predict(b)
        assert abs(predicted - peak) / peak < 0.03, (b, predicted, peak, phase)


def _synthetic(family, *, fixed, per_sample, slack_per_sample=0.0):
    """A calibration whose phases are known lines: forward/backward/optimizer/loss (bytes)."""
    cal = ex.Calibration(family, "?", [2, 4], ["ok", "ok"])
    cal.phase_peaks = {name: [int(fixed[name] + per_sample[name] * b) for b in (2, 4)] for name in ex.PHASES}
    cal.reserved = [int(max(v[i] for v in cal.phase_peaks.values()) + slack_per_sample * b)
                    for i, b in enumerate((2, 4))]
    cal.context = [500 * MIB, 500 * MIB]
    cal.static = [int(fixed["forward"])] * 2
    return ex_cal.fit_lines(cal)


def _world():
    """Two families (eager, sdpa) × (torch, fusedce): eager's activations grow faster; the fused
    back-end drops the logits' share of the loss phase."""
    cals = []
    for attention, act in (("eager", 700 * MIB), ("sdpa", 420 * MIB)):
        family = ex.Family(attention, False, False, False, 1024)
        fixed = {"forward": 2 * GIB, "loss": 2 * GIB, "backward": 2.2 * GIB, "optimizer": 3.5 * GIB}
        torch_cal = _synthetic(family, fixed=fixed, per_sample={"forward": act, "loss": act + 330 * MIB,
                                                                  "backward": act + 200 * MIB, "optimizer": 0},
                               slack_per_sample=20 * MIB)
        fused_cal = _synthetic(family, fixed=fixed, per_sample={"forward": act, "loss": act + 10 * MIB,
                                                                  "backward": act + 60 * MIB, "optimizer": 0},
                               slack_per_sample=20 * MIB)
        torch_cal.backend, fused_cal.backend = "torch", "fusedce"
        cals += [torch_cal, fused_cal]
    return cals


TERMS = DeviceTerms(context=500 * MIB, context_spread=250 * MIB, noise=2 * MIB, mismatch=0.04, cuda=True)


def _planted(attention, batch, active, terms=None):
    """The synthetic world, readings planted from one of its configurations, and the ranked hypotheses."""
    cals = _world()
    by = {(c.family.attention, c.backend): c for c in cals}
    naive = predict_reading(by[(attention, "torch")], batch, TERMS, 24 * GIB)
    fused = predict_reading(by[(attention, "fusedce")], batch, TERMS, 24 * GIB) if active else naive
    obs = ex.Observation(naive.value / MIB, fused.value / MIB, 24)
    return cals, obs, ex_ver.build_hypotheses(obs, cals, terms or TERMS)


@pytest.mark.parametrize("attention, active, batch", [("eager", True, 18), ("sdpa", True, 24), ("sdpa", False, 20),
                                                      ("eager", False, 12)])
def test_joint_scoring_keeps_the_truth_and_rules_out_a_planted_wrong_family(attention, active, batch):
    _, _, ranked = _planted(attention, batch, active)
    truth = next(h for h in ranked if h.family.attention == attention and h.fused_active == active)
    assert truth.consistent and truth.batch_range[0] <= batch <= truth.batch_range[1]
    # the other fused-path state of the same family predicts a saving far from the one seen
    wrong = next(h for h in ranked if h.family.attention == attention and h.fused_active != active)
    assert not wrong.consistent and "would save" in wrong.why
    assert wrong.tolerance_saving.context == 0  # the context cancels in the saving


def test_the_card_caps_a_reading_between_the_allocated_floor_and_the_card():
    cal = _world()[0]
    b = 26
    free = predict_reading(cal, b, TERMS, 64 * GIB)
    capped = predict_reading(cal, b, TERMS, free.value - 100 * MIB)
    assert capped.capped and capped.fits and capped.value == free.value - 100 * MIB
    assert capped.allocator == capped.value - (TERMS.context + capped.allocated)
    assert not predict_reading(cal, b, TERMS, TERMS.context + capped.allocated - MIB).fits


def test_a_separation_names_outcomes_that_differ():
    cals = _world()
    by = {(c.family.attention, c.backend): c for c in cals}
    naive = predict_reading(by[("sdpa", "torch")], 20, TERMS, 24 * GIB)
    fused = predict_reading(by[("sdpa", "fusedce")], 20, TERMS, 24 * GIB)
    half = (naive.value - fused.value) / 2
    obs = ex.Observation(naive.value / MIB, (naive.value - half) / MIB, 24)
    noisy = DeviceTerms(500 * MIB, 250 * MIB, half, 0.04, True)  # readings this noisy cannot tell the two apart
    ranked = ex_ver.build_hypotheses(obs, cals, noisy)
    assert {h.fused_active for h in ranked if h.consistent} == {True, False}
    sep = ex_con.separating_measurement(ranked, obs, vocab=32777)
    values = [value for _, value, _ in sep.predictions]
    assert len(values) == len(set(values)) == 2 and "logits detector" in sep.sentence
    # hypotheses that predict the same figures get no two-branch sentence at all
    same = [h for h in ranked if h.consistent and h.fused_active]
    twin = ex.Hypothesis(**{**same[0].__dict__, "family": ex.Family("sdpa", True, False, False, 1024)})
    sep = ex_con.separating_measurement([same[0], twin], obs, vocab=32777)
    assert sep.predictions == [] and "no measurement of the step separates them" in sep.sentence


def _cli(args):
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    return CliRunner().invoke(app, ["explain", *args])


@pytest.mark.parametrize("args, message", [
    (["--naive", "30000", "--fused", "22000", "--card", "24"], "--naive 30000 MiB is above the 24 GiB card"),
    (["--naive", "22785", "--fused", "22155", "--card", "24576"], "--card takes GiB: 24576 looks like MiB"),
    (["--naive", "22155", "--fused", "22785", "--card", "24"], "swapped?"),
    (["--naive", "22785", "--fused", "22155", "--card", "24", "--device", "cpu", "--seq", "512"],
     "--seq 512 is longer than the model's 256 positions"),
    (["--naive", "22785", "--fused", "22155", "--card", "24", "--device", "cpu", "--seq-candidates", "512,1024"],
     "every length is longer than the model's 256 positions"),
])
def test_impossible_input_is_refused_in_one_line_before_any_work(args, message, tmp_path):
    out = tmp_path / "never"
    result = _cli([*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("kind", ["device", "pipe", "link", "no folder"])
def test_a_cache_that_cannot_be_appended_is_refused_before_any_step(kind, tmp_path):
    """``--cache /dev/zero`` ran every calibration step, then failed with a traceback on the first append."""
    import os

    cache = {"device": Path("/dev/zero"), "pipe": tmp_path / "pipe", "link": tmp_path / "link",
             "no folder": tmp_path / "missing" / "steps.jsonl"}[kind]
    if kind == "pipe":
        os.mkfifo(cache)
    if kind == "link":
        (tmp_path / "steps.jsonl").write_text("")
        cache.symlink_to(tmp_path / "steps.jsonl")
    out = tmp_path / "never"
    result = _cli(["--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu", "--preset", "tiny",
                   "--seq", "32", "--cache", str(cache), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"--cache {cache}: " in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_without_cuda_explain_refuses_unless_the_cpu_is_asked_for(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    result = _cli(["--naive", "22785", "--fused", "22155", "--card", "24", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "needs the GPU the readings came from" in result.output


def test_the_cpu_path_ranks_predictions_and_never_decides(tmp_path):
    out = tmp_path / "ex"
    result = _cli([*QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["prediction_only"] and not summary["decided"]
    page = (out / "summary.md").read_text()
    assert "**Predictions only (CPU): no verdict.**" in page and "**Decided.**" not in page
    assert "PREDICTED peak allocated bytes" in page and "Tolerance terms: run-to-run noise" in page
    (out / "summary.md").unlink()
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0 and (out / "summary.md").is_file()


@pytest.mark.parametrize("cache", [False, True], ids=["", "its own steps file as the cache"])
def test_an_interrupted_explanation_keeps_its_steps_and_resume_finishes_without_redoing_them(tmp_path, cache):
    from fusedce_profile.explain import STEPS_FILE, explain

    args = dict(naive=3.2, fused=2.9, card=24, preset="tiny", seq=32, attention="sdpa", tied=False,
                checkpointing=False, eval_step=False, device="cpu")
    out = tmp_path / "ex"
    lines = []

    def stop_after_first(line):
        lines.append(line)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        explain(**args, out=out, progress=stop_after_first)
    stored = ex.load_explanation(out)
    assert stored.interrupted and len(stored.calibrations) == 1
    assert "(INTERRUPTED: partial)" in (out / "summary.md").read_text()
    done = (out / STEPS_FILE).read_text().splitlines()
    assert len(done) == 2  # the torch steps at B=2 and B=4
    resumed = explain(**args, out=out, resume=True, cache=out / STEPS_FILE if cache else None)
    assert not resumed.interrupted and len(resumed.calibrations) == 2
    after = (out / STEPS_FILE).read_text().splitlines()
    assert after[:2] == done and len(after) == 5  # + the fused steps and the repeated step, nothing twice


def test_resume_with_another_model_is_refused_before_any_step_and_other_readings_are_judged_anew(tmp_path):
    """A resume measuring another model (here another fused back-end or precision) would reuse none
    of the folder's steps and replace its explanation by another question's: refused, the folder
    unchanged. Other readings reuse the steps."""
    from fusedce_profile.errors import UsageError
    from fusedce_profile.explain import STEPS_FILE, explain

    args = dict(naive=3.2, fused=2.9, card=24, preset="tiny", seq=32, attention="sdpa", tied=False,
                checkpointing=False, eval_step=False, device="cpu")
    out = tmp_path / "ex"

    def stop_after_first(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        explain(**args, out=out, progress=stop_after_first)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for other, said in ((dict(fused_backend="fusedce-fast"), "another --fused-backend"),
                        (dict(mode="fp32"), "another --mode")):
        with pytest.raises(UsageError, match=f"was measured with {said}; give the same model options"):
            explain(**{**args, **other}, out=out, resume=True)
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # a run killed before it stored an explanation: its steps (here torch's only) tell what it measured
    explanation = (out / "explain.json").read_bytes()
    (out / "explain.json").unlink()
    for other, said in ((dict(mode="fp32"), r"another model, device or --mode"),
                        (dict(preset="gpt2"), "another model")):
        with pytest.raises(UsageError, match=f"was measured with {said}"):
            explain(**{**args, **other}, out=out, resume=True)
    (out / "explain.json").write_bytes(explanation)
    kept = (out / STEPS_FILE).read_text().splitlines()
    resumed = explain(**{**args, "naive": 3.3}, out=out, resume=True)
    assert not resumed.interrupted and (out / STEPS_FILE).read_text().splitlines()[:len(kept)] == kept


def test_resume_refuses_a_hard_linked_steps_file_before_any_step(tmp_path):
    import os

    from fusedce_profile.explain import STEPS_FILE, StepStore

    steps = tmp_path / STEPS_FILE
    steps.write_text("")
    os.link(steps, tmp_path / "elsewhere.jsonl")
    with pytest.raises(OSError, match="a hard link") as refused:
        StepStore(steps, None, resume=True)
    assert refused.value.filename == str(steps)


def test_a_signal_while_the_finished_explanation_is_stored_is_taken_after_it(tmp_path, monkeypatch):
    """SIGTERM while explain wrote its finished explanation left neither summary.md nor, at times,
    explain.json, though the command said "report DIR/summary.md": the store now finishes first."""
    import os
    import signal

    from fusedce_profile.explain import explain
    from fusedce_profile.signals import Terminated, stop_on_sigterm
    from fusedce_reports import explain_report

    write = explain_report.write_explain_report

    def signalled(folder):
        os.kill(os.getpid(), signal.SIGTERM)
        return write(folder)

    monkeypatch.setattr(explain_report, "write_explain_report", signalled)
    out = tmp_path / "ex"
    with pytest.raises(Terminated), stop_on_sigterm():
        explain(naive=3.2, fused=2.9, card=24, preset="tiny", seq=32, attention="sdpa", tied=False,
                checkpointing=False, eval_step=False, device="cpu", out=out)
    assert not ex.load_explanation(out).interrupted  # every step had finished: the explanation is whole
    assert "Predictions only" in (out / "summary.md").read_text()


def test_explanation_round_trips_through_its_json(tmp_path):
    cals = _world()
    obs = ex.Observation(15000, 14000, 24)
    ranked = ex_ver.build_hypotheses(obs, cals, TERMS)
    e = ex.Explanation(obs, "builtin:x", None, "cuda", "nvidia-smi", cals, ranked, None, False, "c", False)
    ex.save_explanation(tmp_path, e)
    assert ex.load_explanation(tmp_path) == e


@pytest.mark.faults
@pytest.mark.parametrize("signum, code", [(15, 143)])
def test_a_signal_keeps_the_finished_steps_and_marks_the_report_interrupted(tmp_path, signum, code):
    import os

    from processes import cli_env, kill_group, start_cli, wait_for, workers_of

    out = tmp_path / "ex"
    process = start_cli(["explain", *QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--out", str(out)],
                        cli_env())
    try:
        steps = out / "explain_steps.jsonl"
        wait_for(lambda: steps.is_file() and steps.read_text().count("\n") >= 1, 120, "a finished step", process)
        os.killpg(process.pid, signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        kill_group(process)
    assert process.returncode == code, stderr
    assert workers_of(process.pid, wait_s=10) == []
    assert ex.load_explanation(out).interrupted
    assert "(INTERRUPTED: partial)" in (out / "summary.md").read_text()
    kept = steps.read_text().splitlines()
    n = len(kept)
    assert f"interrupted: {n} finished step{'s' if n > 1 else ''} kept; partial report {out}/summary.md; continue " \
           f"with the same command and --resume --out {out}" in " ".join(stdout.split())
    resumed = _cli([*QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert steps.read_text().splitlines()[:len(kept)] == kept and not ex.load_explanation(out).interrupted


def test_a_stop_before_any_step_finished_promises_no_steps_and_no_report(tmp_path):
    from fusedce_profile.explain import what_the_stop_left
    from fusedce_profile.signals import Terminated

    (tmp_path / "summary.md").write_text("a page of no step")  # as an explain stopped at once can leave
    assert what_the_stop_left(tmp_path, Terminated()) == \
        f"interrupted before any step had finished; continue with the same command and --resume --out {tmp_path}"


def test_families_ruled_out_at_every_batch_size_are_named_with_the_saving_they_would_give():
    from fusedce_profiler.judgements.explain.others import other_hypotheses, ruled_out_groups

    cals, obs, ranked = _planted("sdpa", 24, True)
    sentences = ruled_out_groups(ranked, obs)
    seen = (obs.naive_mib - obs.fused_mib) * MIB / GIB
    assert f"sdpa with the fused path NOT active: ruled out in all 1 families — at any B that reaches the naive " \
           f"reading it would save ≤ 0.00 GiB, against {seen:.2f} GiB seen" in sentences
    others = {o.name: o for o in other_hypotheses(obs, ranked, cals, TERMS)}
    assert len(others) == 4 and not others["the allocator's cache left by an evaluation pass"].consistent
    assert "no consistent configuration peaks there" in \
        others["the optimizer step (AdamW's foreach copies) holds the peak"].why


def test_the_blind_benchmark_judges_truth_and_verdicts_from_an_explanation():
    from benchmarks.explain_blind import Case, judge

    cals, obs, ranked = _planted("eager", 18, True)
    e = ex.Explanation(obs, "m", None, "cuda", "nvidia-smi", cals, ranked, None, True, "c", True)
    right = judge(Case("x", "eager", 1024, 18, True), e)
    assert right["truth_consistent"] and right["truth_batch_in_range"] and right["decided_right"]
    wrong = judge(Case("y", "sdpa", 1024, 18, False), e)
    assert not wrong["truth_consistent"] and wrong["decided_right"] is False


def test_an_explanation_of_another_layout_is_refused_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    (tmp_path / "explain.json").write_text(json.dumps({"observation": {"naive_mib": 1, "fused_mib": 1,
                                                                        "total_gib": 24, "tolerance": 0.05}}))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not an explanation this version can read" in result.output
    assert "Traceback" not in result.output


def test_the_example_folder_renders_from_its_stored_explanation(tmp_path):
    import shutil
    from pathlib import Path

    from fusedce_reports.explain_report import write_explain_report

    example = Path(__file__).resolve().parents[1] / "examples" / "explain" / "user-gpt-22785-22155"
    shutil.copytree(example, tmp_path / "ex")
    page = write_explain_report(tmp_path / "ex").read_text()
    assert page == (example / "summary.md").read_text()
    assert "sdpa with the fused path active: ruled out in all 12 families" in page


def _step(job, per_sample, static=2 * GIB, slack=0.1):
    """A measured full-size step whose peak grows by ``per_sample`` bytes per sample."""
    from fusedce_profiler.instrument.protocol import Phase
    from fusedce_profiler.instrument.step.jobs import ModelResult
    from fusedce_profiler.instrument.step.step import StepMemory

    peak = int(static + per_sample * job.batch)
    phases = [Phase(name, static, static, int(static + share * per_sample * job.batch))
              for name, share in (("forward", 0.5), ("loss", 1.0), ("backward", 0.7), ("optimizer", 0.1))]
    memory = StepMemory("cuda-allocator", 0, 0, 0, 0, static, 0, 0, 0, 0, peak, "loss", [], phases,
                        peak_reserved=int(peak + slack * (peak - static)), context=500 * MIB)
    return ModelResult(job=job, memory=memory, extra={"num_alloc_retries": 0})


def test_confirmation_searches_b_on_the_measured_naive_reading_and_reports_the_prediction_error():
    _, obs, ranked = _planted("sdpa", 20, True)
    truth = next(h for h in ranked if h.family.attention == "sdpa" and h.fused_active)
    # the user's model allocates 10 % more per sample than the stand-in predicted: the right B is smaller
    runs = []

    def runner(jobs):
        runs.append([(j.backend, j.batch, j.memory_limit_bytes) for j in jobs])
        per_sample = {"torch": 1.1 * (420 + 330) * MIB, "fusedce": 1.1 * (420 + 60) * MIB}
        return [_step(j, per_sample[j.backend], static=int(2.2 * GIB)) for j in jobs]

    base = ModelJob(get_preset("tiny"), "torch", 1, 1024, device="cuda", trace=False)
    predicted = truth.batch
    sentences = ex_ver.confirm([truth], base, obs, TERMS, runner, top=1)
    assert predicted == 20 and runs[0] == [("torch", 20, 24 * GIB), ("fusedce", 20, 24 * GIB)]
    assert len(runs) == 2 and runs[1][0][1] < runs[0][0][1]  # one more B, smaller
    assert truth.batch == runs[1][0][1] and truth.measured_naive is not None
    assert f"at the predicted B={runs[0][0][1]} the model's step was predicted" in sentences[0]
    assert "B searched" in sentences[0]


def test_a_calibration_step_too_large_for_the_gpu_is_measured_again_at_half_the_batch(tmp_path):
    from fusedce_profile.explain_run import ExplainRun
    from fusedce_profiler.instrument.step.jobs import ModelResult

    family = ex.Family("sdpa", False, False, False, 1024)
    base = ModelJob(get_preset("tiny"), "torch", 1, 1024, device="cuda", trace=False)
    obs = ex.Observation(20000, 19000, 24)
    run = ExplainRun(obs, None, base, [family], None, tmp_path, on_gpu=True, confirm=0, stand_in=True,
                     progress=lambda line: None)
    asked = []

    def run_job(job, purpose):
        asked.append(job.batch)
        if job.batch > 6:
            return ModelResult(job=job, status="oom", message="CUDA out of memory")
        return _step(job, 300 * MIB)

    run._calibrate(run_job)
    assert asked[:2] == [8, 16] and asked[2:6] == [4, 8, 2, 4]  # 8192/16384 tokens, then halved twice
    assert all(c.batches == [2, 4] and c.fitted for c in run.calibrations)


def test_a_fallback_that_reads_one_bf16_logits_copy_above_the_naive_step_stays_consistent():
    # measured on the H200: a wrapper that falls back to fp32 logits read 1,024 MiB above the naive
    # step at B=16, T=1024, V=32777 (benchmarks/results/explain-blind-h200-2026-12-03)
    cals = _world()
    by = {(c.family.attention, c.backend): c for c in cals}
    naive = predict_reading(by[("sdpa", "torch")], 16, TERMS, 24 * GIB)
    obs = ex.Observation(naive.value / MIB, naive.value / MIB + 1024, 24, fused_larger=True)

    def inactive(terms):
        ranked = ex_ver.build_hypotheses(obs, cals, terms)
        return next(h for h in ranked if h.family.attention == "sdpa" and not h.fused_active)

    with_vocab = DeviceTerms(500 * MIB, 250 * MIB, 2 * MIB, 0.04, True, vocab=32777)
    assert inactive(with_vocab).consistent
    assert not inactive(TERMS).consistent  # without the fallback's allowance the truth would be ruled out


def _measured_as_predicted(job, reading, context=500 * MIB):
    """A full-size step of the stand-in that reads exactly ``reading`` (its allocated peak and
    reserved bytes as predicted)."""
    from fusedce_profiler.instrument.step.jobs import ModelResult
    from fusedce_profiler.instrument.step.step import StepMemory

    memory = StepMemory("cuda-allocator", 0, 0, 0, 0, 2 * GIB, 0, 0, 0, 0, int(reading.allocated), "loss", [], [],
                        peak_reserved=int(reading.value - context), context=context)
    return ModelResult(job=job, memory=memory, extra={"num_alloc_retries": 0})


def test_a_confirmation_of_a_stand_in_judges_its_step_with_the_hypothesis_extra_activations():
    # The readings come from an implementation keeping 90 MiB more activations per sample than the
    # stand-in. The full-size step measures the stand-in, which keeps none of them: measured exactly
    # as the stand-in's own prediction, the prediction error is 0 % and the hypothesis stays
    # consistent once the modelled shift is added (without it, B would be searched upwards to make
    # up for activations the stand-in does not have).
    import dataclasses

    cals = _world()
    by = {(c.family.attention, c.backend): c for c in cals}
    card, batch, extra = 24 * GIB, 18, 90 * MIB
    naive = predict_reading(by[("sdpa", "torch")], batch, TERMS, card, extra)
    fused = predict_reading(by[("sdpa", "fusedce")], batch, TERMS, card, extra)
    obs = ex.Observation(naive.value / MIB, fused.value / MIB, 24)
    terms = dataclasses.replace(TERMS, extra_per_token=2 * extra / 1024)
    ranked = ex_ver.build_hypotheses(obs, cals, terms)
    truth = next(h for h in ranked if h.family.attention == "sdpa" and h.fused_active)
    assert truth.consistent and truth.extra_activations > 0
    runs = []

    def runner(jobs):
        runs.append([j.batch for j in jobs])
        return [_measured_as_predicted(j, predict_reading(by[("sdpa", j.backend)], j.batch, terms, card))
                for j in jobs]

    base = ModelJob(get_preset("tiny"), "torch", 1, 1024, device="cuda", trace=False)
    chosen = truth.batch
    sentences = ex_ver.confirm([truth], base, obs, terms, runner, top=1, calibrations=cals)
    assert len(runs) == 1 and truth.batch == chosen  # no B search: the shift accounts for the gap
    assert truth.consistent, truth.why
    assert "(+0.0%), allocated peak off by +0.0%" in sentences[0], sentences[0]
    assert "more for the extra activations" in sentences[0] and "modelled for the extra activations" in truth.why
    # without the calibrations the same step is judged bare: below the reading, so B is searched upwards
    truth2 = next(h for h in ex_ver.build_hypotheses(obs, cals, terms)
                  if h.family.attention == "sdpa" and h.fused_active)
    runs.clear()
    ex_ver.confirm([truth2], base, obs, terms, runner, top=1)
    assert len(runs) == 2 and runs[1][0] > runs[0][0]


def test_the_python_explain_prepares_its_folder_as_the_command_does(tmp_path):
    from fusedce_profile.errors import UsageError
    from fusedce_profile.explain import explain

    args = dict(naive=3.2, fused=2.9, card=24, preset="tiny", seq=32, attention="sdpa", tied=False,
                checkpointing=False, eval_step=False, device="cpu")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UsageError, match="link"):
        explain(**args, out=tmp_path / "link")
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    for force in (False, True):  # no option lets a run into a folder no run wrote
        with pytest.raises(UsageError, match="not a run folder .* choose a new or empty folder"):
            explain(**args, out=foreign, force=force)
    assert (foreign / "mine.txt").read_text() == "keep" and not any(target.iterdir())


def test_gpu_readings_typed_in_gib_are_refused_naming_the_mib_figure():
    """``--naive 22.2 --fused 21.6`` (GiB typed for MiB) was explained as readings of 22 MiB."""
    from fusedce_profiler.judgements.explain.readings import check_readings_are_mib

    with pytest.raises(ValueError, match=r"--naive takes MiB, as nvidia-smi shows them: 22.2 is below .* 22,733 MiB"):
        check_readings_are_mib(ex.Observation(22.2, 21.6, 24))
    with pytest.raises(ValueError, match="--fused takes MiB"):
        check_readings_are_mib(ex.Observation(22785, 21.6, 24))
    check_readings_are_mib(ex.Observation(22785, 22155, 24))


def test_a_stop_of_a_resumed_run_does_not_take_the_earlier_explanation_for_its_own(tmp_path):
    """``--resume`` with other readings judges them anew: stopped before it stored its explanation,
    the folder's is the earlier run's, and the line says the steps are kept, not "once stored"."""
    from fusedce_profile.explain import explanation_stamp, what_the_stop_left
    from fusedce_profile.signals import Terminated

    out = tmp_path / "run"
    assert _cli([*QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--out", str(out)]).exit_code == 0
    before = explanation_stamp(out)
    assert before is not None
    said = what_the_stop_left(out, Terminated(), before)
    assert said.startswith("interrupted: ") and "kept" in said and "once the explanation was stored" not in said
    ex.save_explanation(out, ex.load_explanation(out))  # the run's own, stored as it was stopped
    assert what_the_stop_left(out, Terminated(), before).startswith("stopped by SIGTERM once the explanation was stored")


def test_a_cache_over_its_size_limit_is_refused_before_the_folder_is_made(tmp_path):
    from fusedce_profiler.instrument.confined import size_limit

    cache = tmp_path / "steps.jsonl"
    with open(cache, "wb") as fh:
        fh.truncate(size_limit(cache) + 1)  # sparse: no disk used
    out = tmp_path / "run"
    result = _cli([*QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--cache", str(cache), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"--cache {cache}: {size_limit(cache) + 1} bytes, over the limit" in " ".join(result.output.split())
    assert not out.exists()


def test_an_explanation_that_cannot_be_stored_keeps_the_steps_and_says_how_to_judge_them(tmp_path):
    out = tmp_path / "run"
    args = [*QUICK, "--naive", "3.2", "--fused", "2.9", "--card", "24", "--out", str(out)]
    assert _cli(args).exit_code == 0
    (out / "summary.md").unlink()
    (out / "summary.md").mkdir()
    result = _cli([*args, "--naive", "3.3", "--resume"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"summary.md: Is a directory; the finished steps are kept in {out}: the same command with --resume " \
           f"--out {out} judges them once that is mended" in said, said
    (out / "summary.md").rmdir()
    assert _cli([*args, "--naive", "3.3", "--resume"]).exit_code == 0
