"""One measured training step of the model and where its peak memory goes.

The step is: ``zero_grad`` → forward of the trunk → the loss back-end on
(hidden, lm_head weight, targets) → backward → AdamW step, under bf16 autocast with fp32
master weights (``mode="amp-bf16"``) or in plain fp32 (``mode="fp32"``). It runs after
``warmup_steps`` unmeasured steps, so the optimizer state exists and compilation and
autotuning are done (what a user's ``nvidia-smi`` shows is the second step's high-water mark).

Phases, as the :class:`~fusedce_profiler.instrument.protocol.MemoryMeter` sees them:
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
from fusedce_profiler.instrument.backends import LossFn
from fusedce_profiler.instrument.models.head import first_tensor, locate_head
from fusedce_profiler.instrument.models.source import BuiltModel
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.instrument.step.memory import Part, SavedTensorCounter, StepMemory, compose_peak
from fusedce_profiler.instrument.tracing.attribution import Attribution
from fusedce_profiler.instrument.tensors import optimizer_state_tensors, tensor_bytes
from fusedce_profiler.instrument.tracing.trace import StepTracer, attention_shape, attribute


@dataclass
class StepOutcome:
    """The measured step's memory, its loss value, its wall time (ms) and, when traced, the
    attribution of a second, traced step's peak."""

    memory: StepMemory
    loss: float
    time_ms: float
    attribution: Attribution | None = None


class _HeadReached(Exception):
    """Raised by the head's forward pre-hook to stop the model's forward at the head's input."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("LM head reached")
        self.hidden = hidden


@dataclass
class StepLoss:
    """How a training step computes its loss.

    - ``naive``: the model's own forward through its head, then ``F.cross_entropy`` on the
      logits, as users write it (the ``torch`` back-end);
    - ``hidden``: the model's forward is stopped at the head's input (a forward pre-hook on the
      head module raises), and ``fn(hidden (N, H), weight (V, H), target (N,), bias, options)``
      — a loss back-end — computes the loss from the parameter the head's forward uses;
    - ``patched``: a back-end that patched the model itself (``liger-patched``): the model is
      called with ``labels`` (Hugging Face convention: ``labels[t + 1]`` is position t's target)
      and returns the loss.
    """

    kind: str
    fn: LossFn | None = None


def _as_built(model) -> BuiltModel:
    if isinstance(model, BuiltModel):
        return model
    config = getattr(model, "config", None)
    head = locate_head(model, vocab=getattr(config, "vocab_size", None))
    return BuiltModel(module=model, head=head, kind="builtin", trunk=getattr(model, "final_norm", None))


def _as_step_loss(loss) -> StepLoss:
    return loss if isinstance(loss, StepLoss) else StepLoss("hidden", loss)


def hf_labels(targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Hugging Face labels whose shifted targets are ``targets[:, :-1]`` (position t predicts
    labels[t + 1]; the last position has no label there)."""
    first = torch.full_like(targets[:, :1], ignore_index)
    return torch.cat([first, targets[:, :-1]], dim=1)


def train_step(model, loss_fn, options: LossOptions, optimizer: torch.optim.Optimizer,
               input_ids: torch.Tensor, targets: torch.Tensor, mode: str,
               meter: MemoryMeter | None = None, counter: SavedTensorCounter | None = None,
               tracer=None) -> torch.Tensor:
    """One forward/backward/AdamW step; returns the loss (detached). Marks phases on ``meter``
    (``forward``, ``loss`` when the head's input is reached, ``backward`` when its gradient is,
    ``optimizer``) and, with a :class:`~fusedce_profiler.instrument.tracing.trace.StepTracer`, the same marks plus
    ``backward-start`` and the loss region."""
    built, step_loss = _as_built(model), _as_step_loss(loss_fn)
    marked: set[str] = set()

    def mark(name: str) -> None:
        if name in marked:
            return
        marked.add(name)
        if meter is not None and name != "backward-start":
            meter.mark(name)
        if tracer is not None:
            tracer.mark(name)

    region = tracer.loss_region() if tracer is not None else contextlib.nullcontext()
    region_open = []

    def reach_head(hidden) -> None:
        if "loss" in marked:
            return
        if counter is not None:
            counter.active = False
        mark("loss")
        region.__enter__()
        region_open.append(True)
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(lambda grad: mark("backward"))

    def close_region() -> None:
        if region_open:
            region_open.pop()
            region.__exit__(None, None, None)

    optimizer.zero_grad(set_to_none=True)
    mark("forward")
    head, handles = built.head, []
    try:
        with autocast(mode, input_ids.device):
            with counter.hooks() if counter else contextlib.nullcontext():
                if step_loss.kind == "naive":
                    handles.append(head.module.register_forward_pre_hook(
                        lambda mod, args, kwargs: reach_head(first_tensor(args, kwargs)), with_kwargs=True))
                    logits = built.logits_of(built.call(input_ids))
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                           ignore_index=options.ignore_index, reduction=options.reduction)
                elif step_loss.kind == "hidden":
                    def stop(mod, args, kwargs):
                        raise _HeadReached(first_tensor(args, kwargs))

                    handles.append(head.module.register_forward_pre_hook(stop, with_kwargs=True))
                    try:
                        built.call(input_ids)
                    except _HeadReached as reached:
                        hidden = reached.hidden
                    else:
                        raise RuntimeError(f"the model's forward returned without calling its LM head "
                                           f"{head.info.path!r}: name the head module with --head")
                    reach_head(hidden)
                    loss = step_loss.fn(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1),
                                        head.bias, options)
                elif step_loss.kind == "patched":
                    if built.trunk is not None:
                        handles.append(built.trunk.register_forward_hook(
                            lambda mod, args, out: reach_head(first_tensor((out,), {}))))
                    labels = hf_labels(targets, options.ignore_index)
                    out = built.module(input_ids=input_ids, labels=labels, use_cache=False)
                    loss = out.loss if hasattr(out, "loss") else out[0]
                    reach_head(None)
                else:
                    raise ValueError(f"unknown step loss kind {step_loss.kind!r}")
        close_region()
    finally:
        for handle in handles:
            handle.remove()
        close_region()
    if counter is not None:
        counter.active = True
    mark("backward-start")
    loss.backward()
    mark("backward")  # no-op when the head's input gradient already marked it
    mark("optimizer")
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def evaluation_step(model, input_ids: torch.Tensor, targets: torch.Tensor, mode: str) -> tuple[float, float]:
    """A validation pass that materialises the full (B, T, V) logits, as Lightning's sanity
    check or any accuracy metric does; returns (loss, next-token accuracy)."""
    built = _as_built(model)
    built.module.eval()
    try:
        with autocast(mode, input_ids.device):
            logits = built.logits_of(built.call(input_ids))
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            accuracy = (logits.argmax(-1) == targets).float().mean()
        return float(loss), float(accuracy)
    finally:
        built.module.train()


def measure_step(model, loss_fn, options: LossOptions, optimizer: torch.optim.Optimizer,
                 input_ids: torch.Tensor, targets: torch.Tensor, mode: str, *,
                 eval_first: bool = False, warmup_steps: int = 1, trace: bool = False,
                 heads: list[int] | None = None) -> StepOutcome:
    """Warm up, then measure one training step.

    ``model``: a :class:`~fusedce_profiler.instrument.models.source.BuiltModel` or a module whose head can be
    located (the built-in GPT); ``loss_fn``: a :class:`StepLoss` or a loss back-end (the
    ``hidden`` kind). ``eval_first`` runs :func:`evaluation_step` before the warm-up, as a
    sanity check does. On the CPU the meter sees only allocations made while it runs; what is
    alive before (parameters, optimizer state, batch) is added as its baseline. With ``trace``
    one more step runs under :class:`~fusedce_profiler.instrument.tracing.trace.StepTracer` and its peak is attributed by
    module and kind (``outcome.attribution``), checked against the meter's peak.
    """
    built = _as_built(model)
    device = input_ids.device
    params = list(built.module.parameters())
    if eval_first:
        evaluation_step(built, input_ids, targets, mode)
    for _ in range(warmup_steps):
        train_step(built, loss_fn, options, optimizer, input_ids, targets, mode)
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
        loss = train_step(built, loss_fn, options, optimizer, input_ids, targets, mode, meter, trunk_counter)
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
    attribution = None
    if trace:
        attribution = trace_step(built, loss_fn, options, optimizer, input_ids, targets, mode, heads)
        attribution.metered_peak_bytes = memory.peak
    return StepOutcome(memory=memory, loss=float(loss), time_ms=time_ms, attribution=attribution)


def trace_step(built: BuiltModel, loss_fn, options: LossOptions, optimizer: torch.optim.Optimizer,
               input_ids: torch.Tensor, targets: torch.Tensor, mode: str,
               heads: list[int] | None = None) -> Attribution:
    """One more training step under the tracer; its peak attributed by module and kind
    (``heads``: attention head counts whose B·heads·T·T tensors are attention scores; read from
    the model's config when not given)."""
    device = input_ids.device
    params = list(built.module.parameters())
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    param_bytes = tensor_bytes(params)
    opt_bytes = tensor_bytes(optimizer_state_tensors(optimizer, device))
    batch_bytes = tensor_bytes([input_ids, targets])
    other = (torch.cuda.memory_allocated(device) - param_bytes - opt_bytes) if device.type == "cuda" else batch_bytes
    static = {"parameters": param_bytes, "optimizer state": opt_bytes, "batch and other static": other}
    with StepTracer() as tracer:
        train_step(built, loss_fn, options, optimizer, input_ids, targets, mode, tracer=tracer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    grad_ptrs = {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None}
    config = getattr(built.module, "config", None)
    config_heads, layers = attention_shape(config)
    heads = heads or config_heads
    b, t = input_ids.shape
    return attribute(tracer, device=device, model=built.module, head=built.head.module, static=static,
                     grad_ptrs=grad_ptrs, batch=b, seq=t, vocab=built.head.info.vocab, heads=heads or [1],
                     layers=layers)
