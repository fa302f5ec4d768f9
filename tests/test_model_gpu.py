"""The model mode on CUDA: allocator accounting, reserved/context, the evaluation pass, --fit."""
import dataclasses

import pytest
import torch

from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.judgements.fit import fit_backend, predicted_start
from fusedce_profiler.instrument.step.jobs import ModelJob, run_job_in_worker

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

CONFIG = get_preset("tiny").replace(vocab_size=32768, hidden_size=256, intermediate_size=768,
                                    max_position_embeddings=1024)


def test_cuda_breakdown_sums_to_the_peak_and_device_figures_are_ordered(tmp_path):
    result = run_job_in_worker(ModelJob(CONFIG, "torch", 8, 512, device="cuda"), tmp_path, timeout_s=300)
    assert result.status == "ok", result.message
    m = result.memory
    assert m.source == "cuda-allocator"
    assert sum(p.bytes for p in m.composition) == m.peak
    assert m.peak_phase == "loss"
    assert m.loss_extra >= 8 * 512 * CONFIG.vocab_size * (2 + 4)  # bf16 logits and their fp32 copy at least
    assert m.peak <= m.peak_reserved <= m.smi_peak and m.context > 0


def test_evaluation_pass_raises_reserved_not_allocated(tmp_path):
    """With a fused loss the training step's peak is far below an evaluation pass's full
    logits, so the pass leaves a higher high-water mark reserved (with torch the training
    step itself holds the logits, and the eval blocks are simply reused)."""
    plain = run_job_in_worker(ModelJob(CONFIG, "fusedce", 8, 512, device="cuda"), tmp_path, timeout_s=300)
    after = run_job_in_worker(ModelJob(CONFIG, "fusedce", 8, 512, device="cuda", eval_step=True), tmp_path,
                              timeout_s=300)
    assert plain.status == after.status == "ok"
    assert abs(after.memory.peak - plain.memory.peak) < 64 << 20
    assert after.memory.peak_reserved > plain.memory.peak_reserved


def test_fit_under_a_cap_finds_a_batch_that_runs_and_one_that_does_not(tmp_path):
    """The probes run in fresh processes on ``torch.device("cuda")`` (no index: the memory cap
    must find one). Uncapped, batch 256 fits an H200 easily, so a search that stops below it
    shows the cap was applied; a search that errors reports ``largest == 0``."""
    torch.cuda.empty_cache()  # this process's cache counts as "context" in the probes (device-wide)
    job = ModelJob(CONFIG, "torch", 4, 512, device="cuda")
    probe = run_job_in_worker(job, tmp_path, timeout_s=300)  # measured as the fit probes will be
    assert probe.status == "ok", probe.message
    limit = probe.memory.context + 3 * probe.memory.peak_reserved
    start = predicted_start(probe, "batch", limit, maximum=256)  # as the CLI starts the search
    assert 4 < start < 256
    found = fit_backend(dataclasses.replace(job, batch=start), "batch", limit, maximum=256,
                        runner=lambda j: run_job_in_worker(j, tmp_path, timeout_s=300))
    assert 4 <= found.search.largest < 256, found.best.message if found.best else found
    assert (found.search.largest + 1, False) in found.search.probes  # the bisection closed on the boundary
    best = found.best.memory
    assert found.best.status == "ok" and best.smi_peak <= limit  # fits = context + reserved under the limit
    assert found.best.job.memory_limit_bytes == limit and found.best.job.batch == found.search.largest
