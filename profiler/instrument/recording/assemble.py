"""The record of one finished recorded step: phases, peak, static memory, notes, attribution, snapshot.

:func:`build_record` turns a :class:`~fusedce_profiler.instrument.recording.phases.StepRecording` whose meter
and tracer are closed into the :class:`~fusedce_profiler.instrument.recording.records.RecordedStep` that
:class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder` appends to ``recorded_steps.jsonl``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.protocol import memory_source
from fusedce_profiler.instrument.recording.landmarks import describe_model, model_config
from fusedce_profiler.instrument.recording.phases import StepRecording, dtype_name
from fusedce_profiler.instrument.tensors import optimizer_state_tensors, tensor_bytes
from fusedce_profiler.instrument.models.head import Head
from fusedce_profiler.instrument.recording.records import EvalPass, PhaseMemory, RecordedStep


@dataclass(frozen=True)
class RecordedSubject:
    """What a recorder records, as a finished step's record needs it.

    ``model``: the module trained; ``head``: its LM head (``None`` when not found); ``vocab``:
    the vocabulary (``None`` when unknown); ``label`` / ``fused``: the run's name and whether its
    loss is meant to be fused; ``out``: the run folder; ``passes``: the evaluation passes seen so far.
    """

    model: nn.Module
    head: Head | None
    vocab: int | None
    label: str
    fused: bool | None
    out: Path
    passes: tuple[EvalPass, ...]


def build_record(subject: RecordedSubject, rec: StepRecording, device: torch.device, time_ms: float) -> RecordedStep:
    """The :class:`RecordedStep` of the finished recording ``rec`` of ``subject`` (its meter and
    tracer closed); on CUDA it reads the device's use now, and it saves the step's snapshot
    under the folder's ``snapshots/``."""
    meter = rec.meter
    cuda = device.type == "cuda"
    optimizer_bytes = (tensor_bytes(t for o in rec.optimizers for t in optimizer_state_tensors(o, device))
                       if rec.optimizers else None)
    shift = (optimizer_bytes or 0) if not cuda else 0  # the CPU baseline did not know the optimizer
    phases = []
    for p in meter.record.phases:
        phases.append(PhaseMemory(p.name, p.start_bytes + shift, p.end_bytes + shift, p.peak_bytes + shift,
                                  meter.reserved.get(p.name) if cuda else None,
                                  meter.used.get(p.name) if cuda else None))
    peak = max(phases, key=lambda p: p.peak_allocated)
    batch, seq = rec.shape or (0, 0)
    head = subject.head
    notes = list(rec.notes)
    if "loss" not in rec.marked:
        notes.append("no loss phase: neither the final norm, the LM head nor the model's forward ran before "
                     "backward; the forward phase covers the loss (call recorder.mark('loss') to split it)")
    if "backward" not in rec.marked:
        notes.append("backward() was not called in the recorded step")
    if "optimizer" not in rec.marked:
        notes.append("no optimizer step ran in the recorded step")
    if head is None:
        notes.append("no LM head found: the logits detector needs the vocabulary (pass head= or vocab=)")
    if rec.shape is None:
        notes.append("the batch's shape was not seen (no integer input ids reached the embedding): pass "
                     "batch= and seq=")
    record = RecordedStep(
        step=rec.index, label=subject.label, model=describe_model(subject.model), device=str(device),
        source=memory_source(device), phases=phases, peak_allocated=peak.peak_allocated,
        peak_phase=peak.name, baseline_allocated=phases[0].start_allocated, parameters=rec.parameters,
        gradients_at_start=rec.gradients, optimizer_state=optimizer_bytes, time_ms=time_ms,
        batch=batch, seq=seq, tokens=batch * seq, vocab=subject.vocab, hidden=head.info.hidden if head else None,
        autocast=rec.autocast,
        parameter_dtype=dtype_name(next(subject.model.parameters()).dtype),
        fused=subject.fused, reserved_at_start=rec.reserved_at_start, max_reserved_before=rec.max_reserved_before,
        head=asdict(head.info) if head else None, head_called=rec.head_called,
        passes_before=[p for p in subject.passes if p.before_step <= rec.index], loss=rec.loss, notes=notes)
    if cuda:
        record.peak_reserved = meter.record.peak_reserved_bytes
        free, total = torch.cuda.mem_get_info(device)
        record.device_used = total - free
        record.context = record.device_used - torch.cuda.memory_reserved(device)
        record.smi_peak = record.context + (record.peak_reserved or 0)
    if rec.tracer is not None:
        record.attribution = attribute_step(subject, rec, device, optimizer_bytes or 0, batch, seq)
        record.attribution.metered_peak_bytes = record.peak_allocated
    if rec.snapshot is not None:
        suffix = f"-{_slug(subject.label)}" if subject.label else ""
        stem = subject.out / store.SNAPSHOTS_DIR / f"step-{rec.index}{suffix}"
        pickle_path, timeline_path = rec.snapshot.save(stem)
        record.snapshot = str(pickle_path.relative_to(subject.out))
        record.timeline = str(timeline_path.relative_to(subject.out))
    return record


def attribute_step(subject: RecordedSubject, rec: StepRecording, device: torch.device, optimizer_bytes: int,
                   batch: int, seq: int):
    """The tracer's attribution of the peak of ``rec`` by module and kind
    (:func:`fusedce_profiler.instrument.tracing.trace.attribute`), with ``backward-start`` folded into ``backward``."""
    from fusedce_profiler.instrument.tracing.trace import attention_shape, attribute

    params = list(subject.model.parameters())
    if device.type == "cuda":  # what the allocator held at the start besides parameters and state
        start = rec.meter.record.phases[0].start_bytes if rec.meter.record.phases else 0
        other = start - rec.parameters - optimizer_bytes
    else:  # the CPU profiler sees only the step's own allocations; earlier gradients may be freed in it
        other = rec.gradients
    static = {"parameters": rec.parameters, "optimizer state": optimizer_bytes,
              "batch and other static": max(other, 0)}
    grad_ptrs = {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None}
    config = model_config(subject.model)
    heads, layers = attention_shape(config)
    attribution = attribute(rec.tracer, device=device, model=subject.model,
                            head=subject.head.module if subject.head else None, static=static,
                            grad_ptrs=grad_ptrs,
                            batch=batch or 1, seq=seq or 1, vocab=subject.vocab or 0, heads=heads or [1],
                            layers=layers)
    # The recorder marks "backward-start" with "backward": one phase, named "backward".
    if attribution.peak_phase == "backward-start":
        attribution.peak_phase = "backward"
    for tensor in attribution.large_tensors:
        if tensor.phase == "backward-start":
            tensor.phase = "backward"
    return attribution


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:40]
