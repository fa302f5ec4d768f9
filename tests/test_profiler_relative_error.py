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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_reference_on_the_cpu_gives_the_same_error_without_fp64_host_temporaries(monkeypatch):
    """The grid keeps its fp32 reference on the CPU; a GPU value against it is compared a chunk at
    a time through a device staging buffer, never through a converting host-to-device copy."""
    import fusedce_profiler.instrument.reference as reference_module

    monkeypatch.setattr(reference_module, "COMPARE_CHUNK", 1 << 12)
    generator = torch.Generator().manual_seed(1)
    reference = torch.randn(5 * (1 << 12) + 3, generator=generator)
    value = (reference + 1e-3 * torch.randn(reference.shape, generator=generator)).bfloat16().cuda()
    same_device = relative_error(value, reference.cuda())
    converted = []
    original_copy = torch.Tensor.copy_

    def watching_copy(self, source, *args, **kwargs):
        if self.device != source.device and self.dtype != source.dtype:
            converted.append((source.device, self.dtype))
        return original_copy(self, source, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", watching_copy)
    assert relative_error(value, reference) == pytest.approx(same_device, rel=1e-12)
    assert converted == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_reference_moved_to_the_host_is_page_locked_and_equal():
    from fusedce_profiler.instrument.reference import Reference

    on_gpu = Reference(torch.tensor(2.5, device="cuda"), torch.randn(64, 8, device="cuda"),
                       torch.randn(32, 8, device="cuda"), None)
    host = on_gpu.to_host()
    for got, want in ((host.loss, on_gpu.loss), (host.grad_hidden, on_gpu.grad_hidden),
                      (host.grad_weight, on_gpu.grad_weight)):
        assert got.device.type == "cpu" and got.is_pinned() and torch.equal(got, want.cpu())
    assert host.grad_bias is None
