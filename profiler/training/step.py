"""One measured training step of the model and where its peak memory goes.

The step is: ``zero_grad`` → forward of the trunk → the loss back-end on
(hidden, lm_head weight, targets) → backward → AdamW step, under bf16 autocast with fp32
master weights (``mode="amp-bf16"``) or in plain fp32 (``mode="fp32"``). It runs after
``warmup_steps`` unmeasured steps, so the optimizer state exists and compilation and
autotuning are done (what a user's ``nvidia-smi`` shows is the second step's high-water mark).

Phases, as the :class:`~profiler.protocol.MemoryMeter` sees them:
``forward`` (trunk), ``loss`` (loss forward and the loss's own backward, up to the gradient
of the hidden states), ``backward`` (the rest of the backward), ``optimizer`` (AdamW step).

The peak is written as a sum of named parts that holds exactly (see :func:`compose_peak`):
static bytes at the start of the step (parameters + optimizer state + batch/other), plus
what the phase holding the peak added on top of them.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusedce.options import LossOptions
from profiler.backends import LossFn
from profiler.models.gpt import GPT
from profiler.precision import autocast
from profiler.protocol import MemoryMeter, Phase


@dataclass
class Part:
    """One named slice of the peak, in bytes."""

    name: str
    bytes: int


@dataclass
class StepMemory:
    """Memory of one training step (bytes; absolute unless named ``*_extra``).

    - ``parameters``, ``gradients``, ``optimizer_state``: sizes of those tensors (fp32).
    - ``batch``: the input ids and targets.
    - ``static``: allocated when the step starts (parameters + optimizer state + batch +
      anything else left alive, e.g. cuBLAS workspaces on CUDA).
    - ``activations``: what the trunk's forward left allocated when the loss begins
      (tensors saved for backward, the hidden states).
    - ``saved_tensors``: bytes of the distinct tensors the trunk saved for backward, counted by
      ``saved_tensors_hooks`` (parameters excluded); ``weight_copies``: the part of those that
      are autocast's bf16 copies of fp32 weights.
    - ``loss_extra``: the loss phase's peak above its start (logits, their fp32 copies and
      gradients, the lm_head weight gradient). The loss region is not hooked: hooks could change
      how a compiled back-end runs.
    - ``peak``: the step's peak allocated; ``peak_phase``: the phase where it happened;
      ``composition``: named parts summing exactly to ``peak``.
    - ``peak_reserved``: the caching allocator's peak reserved (CUDA); ``device_used``: bytes
      in use on the device after the step (``mem_get_info``: what ``nvidia-smi`` shows for a
      lone process); ``context``: ``device_used`` minus reserved (CUDA context, cuBLAS/kernels).
      ``smi_peak`` = ``context + peak_reserved``: ``nvidia-smi`` at the step's high-water mark.
    """

    source: str
    parameters: int
    gradients: int
    optimizer_state: int
    batch: int
    static: int
    activations: int
    saved_tensors: int
    weight_copies: int
    loss_extra: int
    peak: int
    peak_phase: str
    composition: list[Part]
    phases: list[Phase]
    peak_reserved: int | None = None
    device_used: int | None = None
    context: int | None = None
    smi_peak: int | None = None
    reserved_before_training: int | None = None

    @property
    def loss_share(self) -> float:
        """The loss region's own extra as a fraction of the step's peak."""
        return self.loss_extra / self.peak if self.peak else 0.0


@dataclass
class StepOutcome:
    """The measured step's memory, its loss value and its wall time (ms)."""

    memory: StepMemory
    loss: float
    time_ms: float


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared storages counted once)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor]:
    """The optimizer's state tensors on ``device`` (AdamW keeps its step counters on the CPU)."""
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.device == device]


class SavedTensorCounter:
    """``saved_tensors_hooks`` that count the distinct tensors autograd saves (bytes).

    Parameters are not counted (they are alive anyway). A saved tensor that is a cast of a
    parameter (autocast's bf16 weight copy: ``ToCopyBackward0`` fed by the parameter) is
    counted in ``weight_copy_bytes`` as well as in ``bytes``.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self._seen: dict[int, int] = {}
        self.weight_copy_bytes = 0

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_ptrs or ptr in self._seen or storage.nbytes() == 0:
            return t
        self._seen[ptr] = storage.nbytes()
        if self._is_parameter_cast(t):
            self.weight_copy_bytes += storage.nbytes()
        return t

    def _is_parameter_cast(self, t: torch.Tensor) -> bool:
        """True for a (view of a) dtype cast of a parameter: ``ToCopyBackward0`` ← parameter."""
        base = t._base if t._base is not None else t
        fn = base.grad_fn
        if fn is None or type(fn).__name__ != "ToCopyBackward0" or not fn.next_functions:
            return False
        source = fn.next_functions[0][0]
        variable = getattr(source, "variable", None)  # AccumulateGrad holds the leaf
        return variable is not None and variable.untyped_storage().data_ptr() in self._param_ptrs

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)


def train_step(model: GPT, loss_fn: LossFn, options: LossOptions, optimizer: torch.optim.Optimizer,
               input_ids: torch.Tensor, targets: torch.Tensor, mode: str,
               meter: MemoryMeter | None = None, counter: SavedTensorCounter | None = None) -> torch.Tensor:
    """One forward/backward/AdamW step; returns the loss (detached). Marks phases on ``meter``."""
    mark = meter.mark if meter is not None else (lambda name: None)
    optimizer.zero_grad(set_to_none=True)
    mark("forward")
    with autocast(mode, input_ids.device):
        with counter.hooks() if counter else contextlib.nullcontext():
            hidden = model(input_ids)
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: mark("backward"))
        mark("loss")
        loss = loss_fn(hidden.reshape(-1, hidden.shape[-1]), model.lm_head_weight, targets.reshape(-1),
                       model.lm_head_bias, options)
    loss.backward()
    mark("optimizer")
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def evaluation_step(model: GPT, input_ids: torch.Tensor, targets: torch.Tensor, mode: str) -> tuple[float, float]:
    """A validation pass that materialises the full (B, T, V) logits, as Lightning's sanity
    check or any accuracy metric does; returns (loss, next-token accuracy)."""
    model.eval()
    try:
        with autocast(mode, input_ids.device):
            logits = model.logits(model(input_ids))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            accuracy = (logits.argmax(-1) == targets).float().mean()
        return float(loss), float(accuracy)
    finally:
        model.train()


def compose_peak(static_parts: list[Part], static: int, phases: dict[str, Phase], peak_phase: str,
                 gradients_end: int) -> list[Part]:
    """Named parts that sum exactly to ``phases[peak_phase].peak_bytes``.

    ``static_parts`` split ``static`` (their remainder becomes "other (workspaces, batch…)").
    After the static bytes: forward → activations so far; loss → activations + loss extra;
    backward → activations + backward working set (gradients so far + activation gradients −
    freed activations); optimizer → gradients + optimizer temporaries.
    """
    parts = list(static_parts)
    parts.append(Part("other at step start", static - sum(p.bytes for p in static_parts)))
    peak = phases[peak_phase].peak_bytes
    at_loss = phases["loss"].start_bytes
    if peak_phase == "forward":
        parts.append(Part("activations (forward)", peak - static))
    elif peak_phase == "loss":
        parts += [Part("activations", at_loss - static), Part("loss region", peak - at_loss)]
    elif peak_phase == "backward":
        parts += [Part("activations", at_loss - static), Part("backward working set", peak - at_loss)]
    else:
        parts += [Part("gradients", gradients_end - static), Part("optimizer temporaries", peak - gradients_end)]
    return parts


def measure_step(model: GPT, loss_fn: LossFn, options: LossOptions, optimizer: torch.optim.Optimizer,
                 input_ids: torch.Tensor, targets: torch.Tensor, mode: str, *,
                 eval_first: bool = False, warmup_steps: int = 1) -> StepOutcome:
    """Warm up, then measure one training step.

    ``eval_first`` runs :func:`evaluation_step` before the warm-up, as a sanity check does.
    On the CPU the meter sees only allocations made while it runs; what is alive before
    (parameters, optimizer state, batch) is added as its baseline.
    """
    device = input_ids.device
    params = list(model.parameters())
    if eval_first:
        evaluation_step(model, input_ids, targets, mode)
    for _ in range(warmup_steps):
        train_step(model, loss_fn, options, optimizer, input_ids, targets, mode)
    reserved_before = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        reserved_before = torch.cuda.memory_reserved(device)
    # Free the last step's gradients now: the CPU profiler cannot see frees of tensors
    # allocated before it started (train_step's own zero_grad is then a no-op).
    optimizer.zero_grad(set_to_none=True)
    baseline = tensor_bytes(params + optimizer_state_tensors(optimizer, device) + [input_ids, targets])
    trunk_counter = SavedTensorCounter(params)
    meter = MemoryMeter(device, baseline_bytes=baseline)
    with meter:
        start = time.perf_counter()
        loss = train_step(model, loss_fn, options, optimizer, input_ids, targets, mode, meter,
                          trunk_counter)
        meter.mark("end")  # closes the optimizer phase
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        time_ms = (time.perf_counter() - start) * 1e3
    gradients = tensor_bytes(p.grad for p in params)

    record = meter.record
    phases = {p.name: p for p in record.phases if p.name != "end"}
    param_bytes = tensor_bytes(params)
    opt_bytes = tensor_bytes(optimizer_state_tensors(optimizer, device))
    batch_bytes = tensor_bytes([input_ids, targets])
    static = phases["forward"].start_bytes
    peak_phase = max(phases.values(), key=lambda p: p.peak_bytes).name
    static_parts = [Part("parameters", param_bytes), Part("optimizer state", opt_bytes), Part("batch", batch_bytes)]
    memory = StepMemory(
        source=record.source,
        parameters=param_bytes,
        gradients=gradients,
        optimizer_state=opt_bytes,
        batch=batch_bytes,
        static=static,
        activations=phases["loss"].start_bytes - static,
        saved_tensors=trunk_counter.bytes,
        weight_copies=trunk_counter.weight_copy_bytes,
        loss_extra=phases["loss"].peak_bytes - phases["loss"].start_bytes,
        peak=phases[peak_phase].peak_bytes,
        peak_phase=peak_phase,
        composition=compose_peak(static_parts, static, phases, peak_phase, phases["optimizer"].start_bytes),
        phases=list(phases.values()),
        peak_reserved=record.peak_reserved_bytes,
        reserved_before_training=reserved_before,
    )
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        memory.device_used = total - free
        memory.context = memory.device_used - torch.cuda.memory_reserved(device)
        memory.smi_peak = memory.context + (record.peak_reserved_bytes or 0)
    return StepOutcome(memory=memory, loss=float(loss), time_ms=time_ms)
