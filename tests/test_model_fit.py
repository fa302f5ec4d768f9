"""--fit: the search for the largest size that fits, with fake memory oracles."""
import math

import pytest

from profiler.configs import get_preset
from profiler.model.fit import fit_backend, largest_fitting
from profiler.model.run import ModelJob, ModelResult


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
    assert [n for n, _ in search.probes] == [4, 2, 1]


def test_everything_fits_stops_at_the_maximum():
    search = largest_fitting(lambda n: True, start=3, maximum=40)
    assert search.largest == 40 and search.hit_maximum
    assert [n for n, _ in search.probes] == [3, 6, 12, 24, 40]


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
        fits = job.batch * job.seq <= budget_tokens
        return ModelResult(job=job, status="ok" if fits else status_when_over)

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
        fit_backend(job, "layers", 1, 2)
