"""Measure one cell in the current process: memory, time, parity.

Protocol (CUDA; the CPU differs only where noted):

1. Build the inputs (:func:`profiler.inputs.make_inputs`) and the loss; run ``warmup``
   forward+backward steps (compilation, autotuning, cuBLAS workspace).
2. Drop the gradients, ``gc.collect(); empty_cache(); reset_peak_memory_stats()``, and
   take the baseline ``memory_allocated()`` with the inputs alive.
3. One forward (under the mode's autocast), then one backward (``loss.backward()``; a
   vector loss is back-propagated with a gradient of ones). Peak extra over the baseline
   during forward, during backward, and over the step (gradients count: they are
   outputs); peak reserved. CPU: :class:`profiler.cpu_memory.CpuMemoryMeter` instead
   (``memory_source="cpu-profiler"``).
4. Parity of that step's loss and gradients against the chunked fp32 reference
   (:mod:`profiler.reference`).
5. ``repeats`` timed forward+backward steps: CUDA events (CPU: wall clock); median,
   min, max in milliseconds.

Out-of-memory raises :class:`torch.OutOfMemoryError`; :func:`measure_cell` turns it
into ``status="oom"`` with the size that failed. Other exceptions become
``status="error"``. A back-end that does not support the cell gives ``"skipped"``.

``CellResult.peak_reserved_bytes`` is the allocator's absolute peak reserved; keys this
module adds to ``CellResult.extra``: ``baseline_reserved_bytes`` (CUDA),
``predicted_forward_bytes`` / ``predicted_backward_bytes`` (the model's phase peaks),
``prediction_note`` (why there is no prediction), ``parity_note`` (why there is no
parity), ``traceback`` (for ``status="error"``), ``warnings`` (the first distinct
warnings raised while measuring, e.g. a back-end falling back to another code path).

Public API: :class:`MeasureSettings`, :func:`measure_cell`, :func:`oom_requested_bytes`.
"""
from __future__ import annotations

import gc
import re
import statistics
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from profiler.backends import LossOptions, get_backend
from profiler.cpu_memory import CpuMemoryMeter
from profiler.inputs import CellInputs, autocast_for, make_inputs
from profiler.memory_model import floor_bytes, predict
from profiler.records import CellResult, CellSpec
from profiler.reference import Reference, parity, reference


#: torch.OutOfMemoryError (torch >= 2.5) or its older CUDA-only name.
OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@dataclass(frozen=True)
class MeasureSettings:
    """``warmup`` untimed steps, ``repeats`` timed steps; ``snapshot_dir``: where to save
    a CUDA memory snapshot and its timeline PNG (``None``: no snapshot)."""

    warmup: int = 1
    repeats: int = 5
    snapshot_dir: str | None = None


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "bytes": 1}
_OOM_PATTERNS = (
    re.compile(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)"),
    re.compile(r"you tried to allocate (\d+) (bytes)"),
)


def oom_requested_bytes(message: str) -> int | None:
    """The size of the failed allocation in an out-of-memory message (CUDA or CPU)."""
    for pattern in _OOM_PATTERNS:
        match = pattern.search(message)
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


#: The last fp32 reference (on the CPU) and the key of the inputs it belongs to: back-ends
#: of the same cell run side by side in one worker and share it.
_last_reference: tuple[str, Reference] | None = None


def _reference_for(spec: CellSpec, inputs: CellInputs, options: LossOptions) -> Reference:
    """The chunked fp32 reference of this cell's inputs (which depend on the spec, not on
    the back-end), computed once per cell and kept on the CPU between back-ends."""
    global _last_reference
    key = CellSpec(**{**asdict(spec), "backend": ""}).key()
    if _last_reference is None or _last_reference[0] != key:
        _last_reference = None  # free the old one before computing the new one
        ref = reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options)
        _last_reference = (key, ref.to("cpu"))
    return _last_reference[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(fn, inputs: CellInputs, options: LossOptions, spec: CellSpec) -> torch.Tensor:
    with autocast_for(spec):
        return fn(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options)


def _backward(loss: torch.Tensor) -> None:
    loss.backward(torch.ones_like(loss) if loss.dim() else None)


def _step(fn, inputs, options, spec) -> torch.Tensor:
    loss = _forward(fn, inputs, options, spec)
    _backward(loss)
    return loss.detach()


def _memory_cuda(fn, inputs, options, spec, result: CellResult, snapshot_dir: str | None) -> torch.Tensor:
    device = inputs.hidden.device
    inputs.clear_grads()
    gc.collect()
    _sync(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result.extra["baseline_reserved_bytes"] = torch.cuda.memory_reserved(device)
    recorder = None
    if snapshot_dir is not None:
        from profiler.snapshot import SnapshotRecorder

        recorder = SnapshotRecorder(device)
        recorder.start()
    loss = _forward(fn, inputs, options, spec)
    _sync(device)
    forward_peak = torch.cuda.max_memory_allocated(device) - base
    reserved_peak = torch.cuda.max_memory_reserved(device)
    if recorder is not None:
        recorder.mark_backward()
    torch.cuda.reset_peak_memory_stats(device)  # the peak restarts from what is allocated now
    _backward(loss)
    _sync(device)
    backward_peak = torch.cuda.max_memory_allocated(device) - base
    result.baseline_bytes = base
    result.peak_forward_bytes = forward_peak
    result.peak_backward_bytes = backward_peak
    result.peak_step_bytes = max(forward_peak, backward_peak)
    result.peak_reserved_bytes = max(reserved_peak, torch.cuda.max_memory_reserved(device))
    result.memory_source = "cuda-allocator"
    if recorder is not None:
        stem = Path(snapshot_dir) / _slug(spec)
        result.snapshot_path, result.timeline_png = recorder.save(stem, title=_title(spec))
    return loss.detach()


def _memory_cpu(fn, inputs, options, spec, result: CellResult) -> torch.Tensor:
    inputs.clear_grads()
    gc.collect()
    with CpuMemoryMeter() as meter:
        with meter.phase("forward"):
            loss = _forward(fn, inputs, options, spec)
        with meter.phase("backward"):
            _backward(loss)
    trace = meter.trace
    result.baseline_bytes = 0  # the profiler counts from the start of the step
    result.peak_forward_bytes = trace.phase_peak_bytes.get("forward", 0)
    result.peak_backward_bytes = trace.phase_peak_bytes.get("backward", 0)
    result.peak_step_bytes = trace.peak_bytes
    result.memory_source = "cpu-profiler"
    return loss.detach()


def _times(fn, inputs, options, spec, repeats: int) -> list[float]:
    device = inputs.hidden.device
    times = []
    for _ in range(repeats):
        inputs.clear_grads()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _step(fn, inputs, options, spec)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            _step(fn, inputs, options, spec)
            times.append((time.perf_counter() - begin) * 1e3)
    inputs.clear_grads()
    return times


def _slug(spec: CellSpec) -> str:
    name = spec.backend.replace(":", "-").replace("/", "-").replace(".", "-")
    parts = [name, spec.mode, f"N{spec.tokens}", f"H{spec.hidden}", f"V{spec.vocab}"]
    if spec.bias:
        parts.append("bias")
    for label, value in (("ign", spec.ignore_frac), ("ls", spec.label_smoothing), ("z", spec.z_loss),
                         ("cap", spec.softcap)):
        if value:
            parts.append(f"{label}{value:g}")
    return "_".join(parts)


def _title(spec: CellSpec) -> str:
    return f"{spec.backend} {spec.mode}  N={spec.tokens} H={spec.hidden} V={spec.vocab}"


def measure_cell(spec: CellSpec, settings: MeasureSettings = MeasureSettings()) -> CellResult:
    """Run the protocol above for ``spec``; never raises for a failing back-end."""
    backend = get_backend(spec.backend)
    result = CellResult(spec=spec, memory_source="cuda-allocator" if spec.device.startswith("cuda")
                        else "cpu-profiler")
    prediction = predict(spec)
    result.predicted_bytes = prediction.peak_bytes
    if prediction.reason:
        result.extra["prediction_note"] = prediction.reason
    if prediction.forward_bytes is not None:
        result.extra["predicted_forward_bytes"] = prediction.forward_bytes
        result.extra["predicted_backward_bytes"] = prediction.backward_bytes
    result.floor_bytes = floor_bytes(spec)
    reason = backend.unsupported(spec)
    if reason:
        result.status, result.message = "skipped", reason
        return result
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _measure(spec, settings, backend, result)
    messages = list(dict.fromkeys(_first_line(str(w.message), 300) for w in caught
                                  if not issubclass(w.category, (DeprecationWarning, FutureWarning))))
    if messages:  # e.g. a back-end falling back to another path for this cell
        result.extra["warnings"] = messages[:5]
    return result


def _measure(spec: CellSpec, settings: MeasureSettings, backend, result: CellResult) -> None:
    """Steps 1-5 of the protocol, filling ``result``; failures become its status."""
    try:
        result.backend_version = backend.version()
        fn = backend.make()
        options = LossOptions.from_spec(spec)
        inputs = make_inputs(spec)
        for _ in range(settings.warmup):
            _step(fn, inputs, options, spec)
        if inputs.hidden.device.type == "cuda":
            loss = _memory_cuda(fn, inputs, options, spec, result, settings.snapshot_dir)
        else:
            loss = _memory_cpu(fn, inputs, options, spec, result)
        grads = [inputs.hidden.grad, inputs.weight.grad, inputs.bias.grad if inputs.bias is not None else None]
        inputs.clear_grads()
        try:
            result.parity = parity(loss, *grads, _reference_for(spec, inputs, options))
        except OutOfMemoryError as exc:  # the back-end's own step did fit
            result.extra["parity_note"] = f"fp32 reference out of memory: {_first_line(str(exc))}"
        del grads, loss
        times = _times(fn, inputs, options, spec, settings.repeats)
        result.times_ms = times
        result.time_ms = statistics.median(times)
        result.time_ms_min, result.time_ms_max = min(times), max(times)
    except Exception as exc:  # a back-end's failure is a result, not a crash of the grid
        requested = oom_requested_bytes(str(exc))
        if isinstance(exc, OutOfMemoryError) or requested is not None:  # the CPU allocator raises RuntimeError
            result.status, result.message = "oom", _first_line(str(exc))
            result.oom_requested_bytes = requested
        else:
            result.status, result.message = "error", f"{type(exc).__name__}: {_first_line(str(exc))}"
            result.extra["traceback"] = traceback.format_exc(limit=8)


def _first_line(text: str, limit: int = 500) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]
