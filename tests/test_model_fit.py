"""--fit: the search for the largest size that fits, with fake memory oracles."""
import math

import pytest
import torch

from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.judgements.fit import fit_backend, largest_fitting
from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 8, 9, 31, 32, 33, 100, 1000])
@pytest.mark.parametrize("start", [1, 8])
def test_finds_the_largest_fitting_value_in_logarithmic_probes(threshold, start):
    search = largest_fitting(lambda n: n <= threshold, start=start, maximum=4096)
    assert search.largest == threshold
    assert not search.hit_maximum
    assert len(search.probes) <= 2 * math.ceil(math.log2(max(threshold, start) + 1)) + 2
    assert all(ok == (n <= threshold) for n, ok in search.probes)


def test_nothing_fits_gives_zero():
    search = largest_fitting(lambda n: False, start=4)
    assert search.largest == 0
    assert [n for n, _ in search.probes] == [4, 3, 1]


def test_everything_fits_stops_at_the_maximum():
    search = largest_fitting(lambda n: True, start=3, maximum=40)
    assert search.largest == 40 and search.hit_maximum
    assert [n for n, _ in search.probes] == [3, 4, 6, 10, 18, 34, 40]


@pytest.mark.parametrize("threshold", [25, 29, 30, 31, 32, 33, 40])
def test_a_close_first_guess_costs_few_probes(threshold):
    search = largest_fitting(lambda n: n <= threshold, start=31, maximum=4096)
    assert search.largest == threshold
    assert len(search.probes) <= 2 + 2 * math.ceil(math.log2(abs(threshold - 31) + 1))
    if threshold in (30, 31):  # the guess or one below: the guess and its neighbour
        assert len(search.probes) == 2


def test_bad_bounds_are_rejected():
    with pytest.raises(ValueError, match="start"):
        largest_fitting(lambda n: True, start=0)
    with pytest.raises(ValueError, match="maximum"):
        largest_fitting(lambda n: True, start=10, maximum=5)


def _fake_runner(budget_tokens, status_when_over="oom"):
    """A memory oracle: a job fits when batch × seq ≤ budget_tokens."""
    seen = []

    def run(job: ModelJob) -> ModelResult:
        seen.append(job)
        if job.batch * job.seq > budget_tokens:
            return ModelResult(job=job, status=status_when_over)
        tokens = job.batch * job.seq  # a finished step always carries its measurements
        return _measured(job.batch, static=1 << 20, context=0, peak=(1 << 20) + 1024 * tokens,
                         reserved=(1 << 20) + 1024 * tokens, job=job)

    return run, seen


@pytest.mark.parametrize("axis, expected", [("batch", 12), ("seq", 48)])
def test_fit_backend_grows_the_chosen_axis_under_the_limit(axis, expected):
    run, seen = _fake_runner(budget_tokens=12 * 64 if axis == "batch" else 4 * 48)
    job = ModelJob(get_preset("tiny"), "torch", 4, 64 if axis == "batch" else 16, device="cpu")
    found = fit_backend(job, axis, limit_bytes=123, maximum=256, runner=run)
    assert found.search.largest == expected
    assert found.best is not None and getattr(found.best.job, axis) == expected
    assert all(j.memory_limit_bytes == 123 for j in seen)


def test_fit_backend_stops_on_a_backend_that_cannot_run():
    job = ModelJob(get_preset("tiny"), "torch", 4, 64, device="cpu")

    def skipped(job):
        return ModelResult(job=job, status="skipped", message="liger runs on cuda only")

    found = fit_backend(job, "batch", 1 << 30, 64, runner=skipped)
    assert found.search.largest == 0 and found.best.status == "skipped"


def test_fit_backend_rejects_unknown_axis():
    job = ModelJob(get_preset("tiny"), "torch", 4, 64, device="cpu")
    with pytest.raises(ValueError, match="axis"):
        fit_backend(job, "layers", 1, 2, runner=lambda j: None)


def test_memory_fraction_leaves_the_context_out_of_the_cap_and_never_exceeds_the_device():
    from fusedce_profiler.instrument.step.jobs import memory_fraction

    assert memory_fraction(limit=24 << 30, context=1 << 30, total=140 << 30) == pytest.approx(23 / 140)
    assert memory_fraction(limit=200 << 30, context=1 << 30, total=140 << 30) == 1.0  # torch rejects > 1
    with pytest.raises(ValueError, match="below the CUDA context"):
        memory_fraction(limit=1 << 29, context=1 << 30, total=140 << 30)


def test_a_wrapped_out_of_memory_error_is_oom_not_an_error_that_stops_the_search(monkeypatch):
    import fusedce_profiler.instrument.step.jobs as run_module

    def compile_failure(*args, **kwargs):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("backend compiler failed") from oom

    monkeypatch.setattr(run_module, "measure_step", compile_failure)
    result = run_module.run_job(ModelJob(get_preset("tiny"), "torch", 2, 8, device="cpu"))
    assert result.status == "oom" and "backend compiler failed" in result.message
    from fusedce_profiler.instrument.oom import is_out_of_memory

    assert not is_out_of_memory(RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED"))


def _measured(batch, static, context, peak, reserved, job=None):
    from fusedce_profiler.instrument.step.memory import StepMemory

    memory = StepMemory(source="cuda-allocator", parameters=0, gradients=0, optimizer_state=0, batch=0,
                        static=static, activations=0, saved_tensors=0, weight_copies=0, loss_extra=0,
                        peak=peak, peak_phase="loss", composition=[], phases=[],
                        peak_reserved=reserved, context=context, smi_peak=context + reserved)
    return ModelResult(job=job or ModelJob(get_preset("tiny"), "torch", batch, 64, device="cuda"), memory=memory)


def test_predicted_start_extrapolates_the_part_that_grows_with_the_batch():
    from fusedce_profiler.judgements.fit import predicted_start

    gib = 1 << 30
    # 2 GiB fixed (static 1.5 + context 0.5), 0.5 GiB allocated per sequence: 24 GiB holds 44
    # sequences (the cache reserved beyond the allocated peak is left out: a capped allocator frees it).
    measured = _measured(batch=32, static=3 * gib // 2, context=gib // 2, peak=3 * gib // 2 + 16 * gib,
                         reserved=24 * gib)
    assert predicted_start(measured, "batch", 24 * gib, maximum=1024) == 44
    assert predicted_start(measured, "batch", 24 * gib, maximum=40) == 40
    assert predicted_start(measured, "batch", gib, maximum=1024) == 1
    assert predicted_start(ModelResult(job=measured.job, status="oom"), "batch", 24 * gib, 1024) is None


def test_fit_backends_searches_each_backend_and_keeps_the_searches_as_it_goes(tmp_path):
    from fusedce_profiler.judgements.fit import fit_backends, load_fits

    run, seen = _fake_runner(budget_tokens=12 * 64)
    base = ModelJob(get_preset("tiny"), "torch", 4, 64, device="cpu")
    measured = {name: ModelResult(job=base, status="oom") for name in ("torch", "fusedce")}  # no guess: start at B=4
    stored = []

    def progress(found):
        stored.append([(f.backend, f.search.largest) for f in load_fits(tmp_path)])

    fits = fit_backends(base, ["torch", "fusedce"], measured, "batch", 123, 256, runner=run, folder=tmp_path,
                        progress=progress)
    assert [(f.backend, f.search.largest) for f in fits] == [("torch", 12), ("fusedce", 12)]
    assert stored == [[("torch", 12)], [("torch", 12), ("fusedce", 12)]]
    assert seen[0].batch == 4 and {j.backend for j in seen} == {"torch", "fusedce"}
