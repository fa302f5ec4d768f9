"""The analytic memory model against CPU measurements (PyTorch's allocator accounting)."""
from __future__ import annotations

import pytest
import torch

from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.grid.cell import MeasureSettings, measure_cell
from fusedce_profiler.grid.memory_model import Tape, floor_bytes, predict
from fusedce_profiler.instrument.records import CellSpec

_ONE_STEP = MeasureSettings(warmup=1, repeats=1)


@pytest.mark.parametrize("mode", ["amp-bf16", "bf16", "fp32"])
@pytest.mark.parametrize("bias", [False, True])
def test_eager_torch_prediction_matches_cpu_measurement(mode, bias):
    spec = CellSpec("torch", 256, 3000, 32, mode=mode, device="cpu", bias=bias)
    result = measure_cell(spec, _ONE_STEP)
    assert result.status == "ok", result.message
    predicted = predict(spec)
    for measured, model in ((result.peak_step_bytes, predicted.peak_bytes),
                            (result.peak_forward_bytes, predicted.forward_bytes),
                            (result.peak_backward_bytes, predicted.backward_bytes)):
        assert abs(measured - model) <= 0.05 * measured, (mode, bias, measured, model)


@pytest.mark.parametrize("mode", ["amp-bf16", "fp32"])
def test_fusedce_prediction_matches_cpu_measurement(mode):
    pytest.importorskip("fusedce.memory_model")
    spec = CellSpec("fusedce", 512, 3000, 32, mode=mode, device="cpu")
    result = measure_cell(spec, _ONE_STEP)
    assert result.status == "ok", result.message
    assert abs(result.peak_step_bytes - result.predicted_bytes) <= 0.05 * result.peak_step_bytes


@pytest.mark.parametrize("backend", ["fusedce-min", "fusedce-fast"])
@pytest.mark.parametrize("mode", ["amp-bf16", "bf16"])
def test_fusedce_frontier_points_are_predicted_and_ordered(backend, mode):
    """fusedce's other frontier points on the CPU: predicted within 5 %, parity like the
    default's, and "min" never above the default's peak (at a head this small its time limit,
    1.2× the default's modelled time, keeps the default's blocks: tests/test_fusedce_time_model.py)."""
    cells = {}
    for name in ("fusedce", backend):
        spec = CellSpec(name, 512, 3000, 32, mode=mode, device="cpu", bias=True)
        result = measure_cell(spec, _ONE_STEP)
        assert result.status == "ok", result.message
        assert abs(result.peak_step_bytes - result.predicted_bytes) <= 0.05 * result.peak_step_bytes
        cells[name] = result
    for grad in ("grad_hidden", "grad_weight", "grad_bias"):
        assert getattr(cells[backend].parity, grad) <= 2 * getattr(cells["fusedce"].parity, grad), grad
    if backend == "fusedce-min":
        assert cells[backend].peak_step_bytes <= cells["fusedce"].peak_step_bytes


def test_fusedce_prediction_is_exact_at_the_cpu_default_runs_smallest_cell():
    """512 tokens of the user's head (the CPU default grid's first fusedce cell, in the precision
    that grid measures on this CPU: amp-bf16 with a native bf16 product, fp32 without one): the
    PyTorch path's temporaries — a weight-gradient chunk of 30464 × 768, the product added a slice
    of rows at a time, the previous block's gradients freed — are all in the model (within 1%)."""
    from fusedce_profile.defaults import SLOW_BF16_RATIO, cpu_bf16_slowdown

    mode = "amp-bf16" if cpu_bf16_slowdown() < SLOW_BF16_RATIO else "fp32"
    spec = CellSpec("fusedce", 512, 32777, 768, mode=mode, device="cpu")
    result = measure_cell(spec, _ONE_STEP)
    assert result.status == "ok", result.message
    assert abs(result.peak_step_bytes - result.predicted_bytes) <= 0.01 * result.peak_step_bytes, (
        result.peak_step_bytes, result.predicted_bytes)


def test_cuda_eager_amp_peak_is_ten_logit_bytes_per_element_plus_the_weight_copy():
    """CUDA amp-bf16: log-probs stay bf16, nll_loss's fp32 copy + its fp32 gradient: 2VH + 10NV."""
    n, h, v = 8192, 768, 32777
    spec = CellSpec("torch", n, v, h, mode="amp-bf16", device="cuda")
    assert predict(spec).peak_bytes == 2 * v * h + 10 * n * v
    assert predict(CellSpec("torch", n, v, h, mode="bf16", device="cuda")).peak_bytes == 6 * n * v


def test_models_without_a_design_say_why():
    prediction = predict(CellSpec("torch-compile", 8, 16, 4, device="cpu"))
    assert prediction.peak_bytes is None and "torch-compile" in prediction.reason
    prediction = predict(CellSpec("torch", 8, 16, 4, device="cpu", softcap=3.0))
    assert prediction.peak_bytes is None and "soft-cap" in prediction.reason


def test_floor_counts_gradients_in_their_dtypes():
    assert floor_bytes(CellSpec("torch", 10, 100, 8, mode="amp-bf16", bias=True)) == 10 * 8 * 2 + 100 * 8 * 4 + 100 * 4
    assert floor_bytes(CellSpec("torch", 10, 100, 8, mode="bf16")) == 10 * 8 * 2 + 100 * 8 * 2


def test_tape_rejects_a_buffer_allocated_twice():
    tape = Tape()
    tape.alloc("x", 10)
    with pytest.raises(ValueError, match="already live"):
        tape.alloc("x", 10)


def test_cpu_meter_sees_temporaries_freed_inside_an_op():
    """A 4 MB temporary created and freed inside the phase still sets the peak."""
    x = torch.randn(1000, 1000)
    with MemoryMeter("cpu") as meter:
        meter.mark("forward")
        y = (x * 2).sum()
    record = meter.record
    assert record.peak_bytes >= x.numel() * 4
    assert record.phase("forward").end_bytes < 1024  # only the scalar survives
    assert record.phase("forward").peak_bytes == record.peak_bytes
    del y


_needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@_needs_cuda
@pytest.mark.parametrize("mode", ["amp-bf16", "bf16"])
def test_eager_torch_prediction_matches_cuda_measurement(mode):
    spec = CellSpec("torch", 4096, 32777, 768, mode=mode, device="cuda")
    result = measure_cell(spec, _ONE_STEP)
    assert result.status == "ok", result.message
    assert abs(result.peak_step_bytes - result.predicted_bytes) <= max(0.05 * result.peak_step_bytes, 64 * 2**20)


@pytest.mark.gpu
@_needs_cuda
def test_cuda_snapshot_is_saved_and_drawn(tmp_path):
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.snapshot import Timeline
    from fusedce_reports.timeline import plot_timeline

    spec = CellSpec("torch", 1024, 32777, 768, mode="amp-bf16", device="cuda")
    result = measure_cell(spec, MeasureSettings(warmup=1, repeats=1, snapshot_dir=str(tmp_path)))
    assert result.status == "ok", result.message
    assert result.snapshot_path.endswith(".pickle")
    timeline = Timeline.from_dict(store.read_json(result.timeline_path))
    assert timeline.backward_ms is not None
    assert abs(timeline.peak_bytes - result.peak_step_bytes) <= 0.05 * result.peak_step_bytes
    assert plot_timeline(timeline, tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
