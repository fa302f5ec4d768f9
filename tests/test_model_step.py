"""The measured training step: CPU accounting, the peak's composition, jobs in subprocesses."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import torch_loss
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.instrument.models.gpt import GPT
from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.instrument.step.jobs import ModelJob, run_job, run_job_in_worker
from fusedce_profiler.instrument.step.data import random_batch as make_batch
from fusedce_profiler.instrument.step.step import measure_step

MIB = 1 << 20


def test_cpu_phase_meter_sees_exact_allocations_and_frees():
    with MemoryMeter("cpu", baseline_bytes=1000) as meter:
        meter.mark("a")
        x = torch.empty(MIB, dtype=torch.uint8)
        y = torch.empty(2 * MIB, dtype=torch.uint8)
        del x
        meter.mark("b")
        z = torch.empty(MIB // 2, dtype=torch.uint8)
        del y, z
    a, b = meter.record.phases
    assert (a.start_bytes, a.peak_bytes, a.end_bytes) == (1000, 1000 + 3 * MIB, 1000 + 2 * MIB)
    assert (b.start_bytes, b.peak_bytes, b.end_bytes) == (1000 + 2 * MIB, 1000 + 2 * MIB + MIB // 2, 1000)
    assert meter.record.peak_phase.name == "a"


def _measure(config, backend=torch_loss, batch=4, seq=32):
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, targets = make_batch(config.vocab_size, batch, seq, "cpu")
    return measure_step(model, backend, LossOptions(), optimizer, ids, targets, "amp-bf16").memory


@pytest.mark.parametrize("tied", [False, True])
def test_breakdown_sums_to_the_measured_peak_and_names_real_sizes(tied):
    config = get_preset("tiny").replace(tie_word_embeddings=tied)
    m = _measure(config)
    assert m.source == "cpu-profiler"
    assert sum(p.bytes for p in m.composition) == m.peak
    assert all(p.bytes >= 0 for p in m.composition)
    assert m.peak == max(p.peak_bytes for p in m.phases)
    param_bytes = 4 * config.num_parameters()
    assert m.parameters == param_bytes and m.gradients == param_bytes
    assert 2 * param_bytes <= m.optimizer_state <= 2 * param_bytes + 64 * 8  # exp_avg, exp_avg_sq, step scalars
    # What the trunk left alive is what it saved for backward plus the hidden states, give or take
    # small bookkeeping tensors.
    hidden_bytes = 4 * 32 * config.hidden_size * 2  # bf16 (B, T, H)
    assert m.saved_tensors <= m.activations <= m.saved_tensors + hidden_bytes + 64 * 1024
    assert 0 < m.weight_copies < m.saved_tensors


def test_naive_loss_region_holds_the_logits_and_a_chunked_one_does_not():
    config = get_preset("tiny").replace(vocab_size=4096)
    n = 4 * 32
    naive = _measure(config)
    assert naive.peak_phase == "loss"
    assert naive.loss_extra >= n * config.vocab_size * (2 + 4 + 4)  # bf16 logits, fp32 copy, fp32 softmax

    def chunked(hidden, weight, target, bias, options):  # recomputes each chunk's logits in backward
        summed = LossOptions(reduction="sum")
        return sum(checkpoint(torch_loss, h, weight, t, bias, summed, use_reentrant=False)
                   for h, t in zip(hidden.split(16), target.split(16))) / target.numel()

    small = _measure(config, chunked)
    assert small.loss_extra < naive.loss_extra / 2
    assert small.peak < naive.peak


def test_job_in_a_worker_round_trips_its_result(tmp_path):
    job = ModelJob(get_preset("tiny"), "torch", 2, 16, device="cpu")
    result = run_job_in_worker(job, tmp_path, timeout_s=120)
    assert result.status == "ok", result.message
    assert result.job == job and result.memory.peak > 0
    assert sum(p.bytes for p in result.memory.composition) == result.memory.peak


def test_memory_limit_on_cpu_reports_oom_when_the_peak_exceeds_it():
    job = ModelJob(get_preset("tiny"), "torch", 2, 16, device="cpu", memory_limit_bytes=MIB)
    result = run_job(job)
    assert result.status == "oom" and "exceeds the limit" in result.message


def test_backend_that_cannot_run_here_is_skipped_not_an_error():
    result = run_job(ModelJob(get_preset("tiny"), "no_such_module_xyz:loss", 2, 16, device="cpu"))
    assert result.status == "skipped" and "not installed" in result.message


def test_a_crashing_backend_is_an_error_result():
    result = run_job(ModelJob(get_preset("tiny"), f"{__name__}:crashing_loss", 2, 16, device="cpu"))
    assert result.status == "error" and "planted failure" in result.message


def crashing_loss(hidden, weight, target, bias, **options):
    raise RuntimeError("planted failure")


@pytest.mark.parametrize("field, value", [("batch", 0), ("attention", "flash"), ("mode", "fp8"),
                                          ("warmup_steps", 0)])
def test_model_job_rejects_bad_values(field, value):
    kwargs = {"config": get_preset("tiny"), "backend": "torch", "batch": 2, "seq": 16, field: value}
    with pytest.raises(ValueError, match=field.split("_")[0]):
        ModelJob(**kwargs)
