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
