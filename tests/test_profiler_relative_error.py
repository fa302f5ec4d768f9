"""The one relative error of the project (profiler/reference.py): parity, benchmarks, training checks."""
import math

import pytest
import torch

from fusedce_profiler.instrument.reference import relative_error


def test_relative_error_is_the_ratio_of_norms():
    reference = torch.tensor([3.0, 4.0])
    assert relative_error(torch.tensor([3.0, 4.0]), reference) == 0.0
    assert relative_error(torch.tensor([0.0, 4.0]), reference) == pytest.approx(3 / 5)
    assert relative_error(torch.tensor([3.0, 4.0], dtype=torch.bfloat16), reference) == 0.0
    assert relative_error(None, reference) is None and relative_error(reference, None) is None


def test_relative_error_of_a_zero_reference_is_zero_only_for_an_exact_zero():
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.tensor([3.0, 4.0]), torch.zeros(2)) == math.inf


def test_relative_error_of_a_non_finite_value_is_nan():
    assert math.isnan(relative_error(torch.tensor([float("nan"), 1.0]), torch.ones(2)))
    assert math.isnan(relative_error(torch.tensor([float("inf"), 1.0]), torch.ones(2)))
    assert math.isnan(relative_error(torch.tensor([float("-inf"), 0.0]), torch.zeros(2)))


def test_relative_error_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        relative_error(torch.zeros(3), torch.zeros(4))


def test_relative_error_accumulates_across_chunks(monkeypatch):
    import fusedce_profiler.instrument.reference as reference_module

    monkeypatch.setattr(reference_module, "COMPARE_CHUNK_CPU", 3)
    reference = torch.arange(1.0, 11.0)
    value = reference + torch.linspace(-1, 1, 10)
    expected = math.sqrt(float(((value - reference) ** 2).sum()) / float((reference ** 2).sum()))
    assert relative_error(value, reference) == pytest.approx(expected)


def test_relative_error_on_the_cpu_equals_the_whole_tensor_fp64_formula():
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(3 * (1 << 15) + 17, generator=generator)
    value = (reference + 1e-3 * torch.randn(reference.shape, generator=generator)).bfloat16()
    difference = value.double() - reference.double()
    expected = math.sqrt(float(difference.square().sum()) / float(reference.double().square().sum()))
    assert relative_error(value, reference) == pytest.approx(expected, rel=1e-12)


def test_relative_error_on_the_cpu_holds_two_small_fp64_buffers_whatever_the_size():
    from fusedce_profiler.instrument.protocol import MemoryMeter
    from fusedce_profiler.instrument.reference import COMPARE_CHUNK_CPU

    reference = torch.randn(1 << 22)  # 4 M elements: 32 MiB as fp64
    value = reference + 1.0
    with MemoryMeter("cpu") as meter:
        meter.mark("compare")
        relative_error(value, reference)
    assert meter.record.extra() <= 2 * 8 * COMPARE_CHUNK_CPU + 4096
