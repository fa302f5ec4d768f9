"""Measure one grid cell in the current process: memory, time, parity.

The protocol (:mod:`fusedce_profiler.instrument.protocol`), as applied to one loss call:

1. Build the inputs (:func:`fusedce_profiler.grid.inputs.make_inputs`) and the loss; run ``warmup``
   forward+backward steps (compilation, autotuning, cuBLAS workspace) — none for a back-end
   whose first step on the cell's device does nothing once
   (:meth:`~fusedce_profiler.instrument.backends.base.Backend.needs_warmup`: the eager and fused
   losses on the CPU), whose metered step then is its first.
2. Clear the gradients, :func:`~fusedce_profiler.instrument.protocol.settle`, and meter one forward (under the
   mode's autocast) and one backward (``loss.backward()``; a vector loss is back-propagated
   with a gradient of ones) as two phases over the baseline of the inputs alive. Peak extra
   over the baseline during forward, during backward and over the step (gradients count:
   they are outputs); peak reserved (CUDA).
3. Parity of that step's loss and gradients against the chunked fp32 reference
   (:mod:`fusedce_profiler.instrument.reference`); a loss or gradient that is not finite is a parity failure.
4. ``repeats`` timed forward+backward steps (:func:`~fusedce_profiler.instrument.protocol.time_calls`);
   median, min, max in milliseconds.

A back-end that does not support the cell gives ``"skipped"``; running out of memory gives
``"oom"`` with the size that failed (:mod:`fusedce_profiler.instrument.oom`); any other exception ``"error"``
with its first line as the message and the traceback in ``extra["traceback"]`` (the
worker also prints it to its log).

Keys this module adds to ``CellResult.extra``: ``baseline_reserved_bytes`` (CUDA),
``predicted_forward_bytes`` / ``predicted_backward_bytes`` (the model's phase peaks),
``prediction_note`` (why there is no prediction), ``parity_note`` (why there is no
parity), ``traceback``, ``warnings`` (the first distinct warnings raised while measuring,
e.g. a back-end falling back to another code path), ``warmup_ms`` (the warm-up's wall time),
``warmup_steps`` (how many warm-up steps ran), ``wall_s`` (the cell's wall time) and ``phase_s``
(its seconds by phase: ``inputs`` — the back-end made and the inputs drawn —, ``warmup``, ``metered``,
``parity`` — the fp32 reference included where this cell computed it —, ``timed``, ``settle``).

Public API: :class:`MeasureSettings`, :func:`measure_cell`.
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from fusedce_profiler.instrument import oom
from fusedce_profiler.instrument.callables import message_of
from fusedce_profiler.instrument.backends import get_backend, options_of
from fusedce_profiler.grid.inputs import CellInputs, make_inputs
from fusedce_profiler.grid.memory_model import floor_bytes, predict
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.instrument.protocol import (MemoryMeter, memory_source, release_freed_memory, settle, synchronize,
                                                 time_calls)
from fusedce_profiler.instrument.records import CellResult, CellSpec, Parity
from fusedce_profiler.instrument.reference import Reference, parity, reference


@dataclass(frozen=True)
class MeasureSettings:
    """``warmup`` untimed steps, ``repeats`` timed steps; ``snapshot_dir``: where to save a
    CUDA allocator snapshot and its timeline (``None``: no snapshot)."""

    warmup: int = 1
    repeats: int = 5
    snapshot_dir: str | None = None


#: The last fp32 reference (in host memory) and the group key of the inputs it belongs to:
#: back-ends of the same cell run side by side in one worker and share it.
_last_reference: tuple[str, Reference] | None = None


def _reference_for(spec: CellSpec, inputs: CellInputs) -> Reference:
    """The chunked fp32 reference of this cell's inputs (which depend on the spec, not on
    the back-end), computed once per group and kept in host memory (page-locked from a GPU) between back-ends."""
    global _last_reference
    key = spec.group_key()
    if _last_reference is None or _last_reference[0] != key:
        _last_reference = None  # free the old one before computing the new one
        ref = reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options_of(spec))
        _last_reference = (key, ref.to_host())
    return _last_reference[1]


def _set_aside_survivors() -> None:
    """Collect the cell's garbage, then put what survives out of the cyclic collector's reach.

    Each cell settles twice (:func:`settle`: a full collection, so that no garbage cycle holds
    tensors into the meter's baseline). With a back-end's package and torch.compile's artefacts
    loaded that walks ~10⁶ objects, 0.2 s each time on the H200's host. What is still alive once
    a cell's frame is gone is module state and caches (compiled graphs, kernels, imported
    packages): frozen (``gc.freeze``), later collections walk only what later cells make. Reference
    counting still frees a frozen object; only a cycle among frozen objects would stay."""
    gc.collect()
    gc.freeze()


class _Step:
    """One forward (under the cell's autocast) and backward of a back-end's loss."""

    def __init__(self, fn, inputs: CellInputs, spec: CellSpec) -> None:
        self.fn, self.inputs, self.spec, self.options = fn, inputs, spec, options_of(spec)

    def forward(self) -> torch.Tensor:
        i = self.inputs
        with autocast(self.spec.mode, self.spec.device):
            return self.fn(i.hidden, i.weight, i.target, i.bias, self.options)

    @staticmethod
    def backward(loss: torch.Tensor) -> None:
        loss.backward(torch.ones_like(loss) if loss.dim() else None)

    def __call__(self) -> torch.Tensor:
        loss = self.forward()
        self.backward(loss)
        return loss.detach()


def _slug(spec: CellSpec) -> str:
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in spec.backend)
    parts = [name, spec.mode, f"N{spec.tokens}", f"H{spec.hidden}", f"V{spec.vocab}"]
    if spec.bias:
        parts.append("bias")
    for label, value in (("ign", spec.ignore_frac), ("ls", spec.label_smoothing), ("z", spec.z_loss),
                         ("cap", spec.softcap)):
        if value:
            parts.append(f"{label}{value:g}")
    return "_".join(parts)


def _measure_memory(step: _Step, result: CellResult, snapshot_dir: str | None) -> torch.Tensor:
    """Step 2: the metered forward and backward; returns the step's loss."""
    inputs, device = step.inputs, torch.device(step.spec.device)
    inputs.clear_grads()
    settle(device)
    if device.type == "cuda":
        result.extra["baseline_reserved_bytes"] = torch.cuda.memory_reserved(device)
    recorder = None
    if snapshot_dir is not None and device.type == "cuda":
        from fusedce_profiler.instrument.snapshot import SnapshotRecorder

        recorder = SnapshotRecorder(device)
        recorder.start()
    with MemoryMeter(device) as meter:
        meter.mark("forward")
        loss = step.forward()
        synchronize(device)
        if recorder is not None:
            recorder.mark_backward()
        meter.mark("backward")
        step.backward(loss)
        synchronize(device)
    record = meter.record
    result.baseline_bytes = record.baseline_bytes
    result.peak_forward_bytes = record.extra("forward")
    result.peak_backward_bytes = record.extra("backward")
    result.peak_step_bytes = record.extra()
    result.peak_reserved_bytes = record.peak_reserved_bytes
    if recorder is not None:
        snapshot, timeline = recorder.save(Path(snapshot_dir) / _slug(step.spec))
        result.snapshot_path, result.timeline_path = str(snapshot), str(timeline)
    return loss.detach()


def _measure_parity(step: _Step, loss: torch.Tensor, result: CellResult, reference: Reference | None) -> None:
    """Step 3: relative errors against the fp32 reference."""
    grads = step.inputs.grads()
    step.inputs.clear_grads()
    try:
        result.parity = parity(loss, *grads, reference or _reference_for(step.spec, step.inputs))
    except oom.OutOfMemoryError as exc:  # the back-end's own step did fit
        result.extra["parity_note"] = f"fp32 reference out of memory: {oom.first_line(str(exc))}"


def _prepare(spec: CellSpec, result: CellResult) -> None:
    """The cell's floor and the analytic prediction, known before anything runs."""
    prediction = predict(spec)
    result.predicted_bytes = prediction.peak_bytes
    if prediction.reason:
        result.extra["prediction_note"] = prediction.reason
    if prediction.forward_bytes is not None:
        result.extra["predicted_forward_bytes"] = prediction.forward_bytes
        result.extra["predicted_backward_bytes"] = prediction.backward_bytes
    result.floor_bytes = floor_bytes(spec)


def measure_cell(spec: CellSpec, settings: MeasureSettings = MeasureSettings(), *, backend=None,
                 inputs: CellInputs | None = None, reference: Reference | None = None) -> CellResult:
    """Run the protocol above for ``spec``; never raises for a failing back-end.

    By default the back-end is ``get_backend(spec.backend)``, the inputs are made from the
    spec and the reference is computed once per group of cells. The benchmark, which runs
    every implementation of a row in one process, passes its own ``backend`` (measured under
    the benchmark's name in ``spec.backend``), shared ``inputs`` and their ``reference``.
    """
    backend = backend or get_backend(spec.backend)
    result = CellResult(spec=spec, memory_source=memory_source(spec.device))
    _prepare(spec, result)
    reason = backend.unsupported(spec)
    if reason:
        result.status, result.message = "skipped", reason
        return result
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _measure(spec, settings, backend, result, inputs, reference)
    if torch.device(spec.device).type == "cpu":  # the cell's own tensors are gone with _measure's frame
        release_freed_memory()
    messages = list(dict.fromkeys(oom.first_line(str(w.message))[:300] for w in caught
                                  if not issubclass(w.category, (DeprecationWarning, FutureWarning))))
    if messages:  # e.g. a back-end falling back to another path for this cell
        result.extra["warnings"] = messages[:5]
    return result


def _measure(spec: CellSpec, settings: MeasureSettings, backend, result: CellResult,
             inputs: CellInputs | None, reference: Reference | None) -> None:
    """Steps 1-4 of the protocol, filling ``result``; failures become its status."""
    started = time.perf_counter()
    phases: dict[str, float] = {}
    last = [started]

    def lap(phase: str) -> None:  # seconds since the previous lap, under ``phase``
        now = time.perf_counter()
        phases[phase] = round(now - last[0], 4)
        last[0] = now

    try:
        result.backend_version = backend.version()
        inputs = inputs or make_inputs(spec)
        step = _Step(backend.make(), inputs, spec)
        lap("inputs")
        warmup = settings.warmup if backend.needs_warmup(spec.device) else 0
        for _ in range(warmup):
            step()
        synchronize(spec.device)
        result.extra["warmup_ms"] = (time.perf_counter() - started) * 1e3
        result.extra["warmup_steps"] = warmup
        lap("warmup")
        loss = _measure_memory(step, result, settings.snapshot_dir)
        lap("metered")
        _measure_parity(step, loss, result, reference)
        del loss
        lap("parity")
        times = time_calls(step, settings.repeats, device=spec.device, before=inputs.clear_grads)
        result.times_ms = times
        result.time_ms = statistics.median(times)
        result.time_ms_min, result.time_ms_max = min(times), max(times)
        lap("timed")
    except Exception as exc:  # a back-end's failure is a result, not a crash of the grid
        if oom.is_out_of_memory(exc):
            result.status, result.message = "oom", oom.first_line(message_of(exc))
            result.oom_requested_bytes = oom.requested_bytes(message_of(exc))
        else:
            result.status, result.message = "error", f"{type(exc).__name__}: {oom.first_line(message_of(exc))}"
            result.extra["traceback"] = traceback.format_exc(limit=12)
            print(f"--- {spec.backend} failed:\n{result.extra['traceback']}", file=sys.stderr, flush=True)
        # numbers of a step that did not finish are not results
        result.parity, result.times_ms, result.time_ms, result.time_ms_min, result.time_ms_max = (
            Parity(), [], None, None, None)
    finally:
        if inputs is not None:
            inputs.clear_grads()
        settle(spec.device)
        lap("settle")
    result.extra["wall_s"] = time.perf_counter() - started
    result.extra["phase_s"] = phases


def run_cell_job(payload: dict) -> dict:
    """The worker's ``cell`` job: ``{"spec": CellSpec dict, "settings": MeasureSettings dict}``."""
    spec = CellSpec.from_dict(payload["spec"])
    result = measure_cell(spec, MeasureSettings(**payload.get("settings", {}))).to_dict()
    _set_aside_survivors()  # a worker's state only: a process that measures in-process keeps its collector
    return result
