"""The measured attribution of a step's peak and the logits detector (CPU)."""
import pytest

from fusedce_profiler.instrument.tracing.attribution import logits_verdict
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.instrument.step.jobs import ModelJob, run_job


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("backend", ["torch", "fusedce"])
def test_builtin_gpt_attribution_sums_to_the_metered_peak_within_2_percent(attention, backend):
    result = run_job(ModelJob(get_preset("tiny"), backend, 4, 64, device="cpu", attention=attention))
    a = result.attribution
    assert result.status == "ok" and abs(a.relative_gap) <= 0.02
    assert a.peak_bytes == sum(k.bytes for k in a.kinds)
    assert a.kind_bytes("parameters") == result.memory.parameters
    assert a.kind_bytes("MLP") > 0 and a.kind_bytes("embedding") >= 0
    scores = a.kind_bytes("attention scores/probabilities")
    assert (scores > 0) == (attention == "eager")


def test_the_naive_loss_materialises_logits_and_fusedce_does_not_on_the_tiny_preset():
    torch_result = run_job(ModelJob(get_preset("tiny"), "torch", 4, 64, device="cpu"))
    fused = run_job(ModelJob(get_preset("tiny"), "fusedce", 4, 64, device="cpu"))
    assert logits_verdict(torch_result.attribution, naive=True)[0] == "materialised"
    status, sentence = logits_verdict(fused.attribution, naive=False)
    assert status in ("transient", "none") and "not active" not in sentence


def test_a_planted_wrapper_that_materialises_the_logits_is_flagged_with_its_line():
    result = run_job(ModelJob(get_preset("tiny"), "examples.user_model:wrapper_that_materialises", 4, 64,
                              device="cpu"))
    status, sentence = logits_verdict(result.attribution, naive=False)
    assert status == "materialised" and "fused path is not active" in sentence
    assert "examples/user_model.py" in sentence
    kept = [t for t in result.attribution.large_tensors if t.kept_for_backward]
    assert kept and all(t.source.startswith("examples/user_model.py") for t in kept)


def test_model_report_does_not_say_not_active_for_fusedce_on_tiny(tmp_path):
    from fusedce_profiler.instrument.step.jobs import append_model_result
    from fusedce_reports.model_report import write_model_report

    for backend in ("torch", "fusedce"):
        append_model_result(tmp_path, run_job(ModelJob(get_preset("tiny"), backend, 4, 64, device="cpu")))
    text = write_model_report(tmp_path).read_text()
    assert "not active" not in text and "Peak by module and kind" in text
    assert (tmp_path / "plots" / "attribution.png").stat().st_size > 5000


def test_a_step_that_makes_and_drops_code_is_recorded_and_attributed(tmp_path):
    """Code compiled during the step and freed before its end leaves profiler events whose names
    point into freed memory (unreadable as UTF-8 in most of them): the step is still recorded,
    its phases and its attribution complete, and the logits named at the forward's line."""
    import warnings

    import torch

    from fusedce_profile import StepRecorder
    from fusedce_profiler.instrument.recording.records import load_recorded_steps

    class Churning(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.lm_head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64, bias=False)

        def forward(self, ids):
            h = self.embed(ids)
            for i in range(200):  # a generated function per call, freed at once (no cycle holds it)
                scope = {}
                exec(compile(f"def scale_{i}_{'x' * 40}(t):\n    return t * 1.0\n", f"<made {i}>", "exec"), scope)
                made = scope.pop(f"scale_{i}_{'x' * 40}")
                h = made(h)
                del made, scope
            return self.lm_head(h)

    model = Churning()
    recorder = StepRecorder(model, tmp_path / "rec", steps=(0,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a step not recorded warns
        with recorder.step():
            torch.nn.functional.cross_entropy(model(torch.randint(0, 64, (2, 8))).flatten(0, 1),
                                              torch.randint(0, 64, (16,))).backward()
    recorder.close()
    (step,) = load_recorded_steps(tmp_path / "rec").records
    assert {"forward", "backward"} <= {p.name for p in step.phases} and step.attribution is not None
    assert step.attribution.peak_bytes == sum(k.bytes for k in step.attribution.kinds) > 0
    sources = {t.source for t in step.attribution.large_tensors}
    assert any(s.startswith("test_trace.py:") and s.endswith("(forward)") for s in sources), sources  # the forward


def test_logits_fusedce_keeps_for_the_backward_are_named_as_its_budget_plans(monkeypatch):
    """An explicit budget on CUDA keeps the bf16 logits of part of the vocabulary (fusedce/kept_plan.py):
    the detector names that tensor as fusedce's, neither as materialised logits (the fused path is
    active) nor as an absence of logits-sized tensors. The plan is forced here (the CPU never keeps)."""
    import dataclasses

    from fusedce import api

    planned = api.plan_chunks

    def keeping(*args, **kwargs):
        plan = planned(*args, **kwargs)
        return dataclasses.replace(plan, strategy="recompute", kept_cols=args[2], hidden_rows=0, hidden_cols=0)

    plain = run_job(ModelJob(get_preset("tiny"), "fusedce", 4, 64, device="cpu", mode="bf16"))
    monkeypatch.setattr(api, "plan_chunks", keeping)
    kept = run_job(ModelJob(get_preset("tiny"), "fusedce", 4, 64, device="cpu", mode="bf16"))
    assert kept.status == "ok", kept.message
    status, sentence = logits_verdict(kept.attribution, naive=False)
    assert status == "kept" and "fused path is active" in sentence and "kept_plan" in sentence, sentence
    n, v = 4 * 64, 512
    assert any(t.kept_for_backward and t.bytes >= n * v * 2 for t in kept.attribution.large_tensors)
    assert logits_verdict(plain.attribution, naive=False)[0] in ("transient", "none")
    # fusedce's own blocks are judged as any allocation (an fp32 block is fp32), never as kept logits
    from fusedce_profiler.instrument.tracing.attribution import FUSEDCE_KEPT

    assert plain.attribution.large_tensors and all(t.dtype_from != FUSEDCE_KEPT
                                                   for t in plain.attribution.large_tensors)
