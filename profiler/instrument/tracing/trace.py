"""Measured attribution of a training step's peak, by module and kind, and the logits detector.

:class:`StepTracer` wraps one training step in ``torch.profiler.profile(profile_memory=True,
with_stack=True, with_modules=True, record_shapes=True)`` (CPU events: allocations on every
device are reported by the allocator on the host, so no CUDA activity is needed) and
:func:`attribute` walks ``prof.profiler.kineto_results.experimental_event_tree()``:

- every ``Allocation`` node (``alloc_size`` > 0 allocates, < 0 frees; ``ptr``) of the step's
  device moves a running total whose maximum is the traced peak; blocks are tracked by ptr;
- each allocation is classified by its parent chain (:class:`fusedce_profiler.instrument.tracing.classify.Classifier`):
  the innermost module that has a kind classifies a forward allocation;
- a backward allocation (under ``autograd::engine::evaluate_function: XBackward0``) carries
  the ``sequence_number`` of the forward op that created the node: it gets that op's module
  and kind (recomputation under activation checkpointing has its own module frames);
- the blocks alive at the peak are split into kinds (:data:`fusedce_profiler.instrument.tracing.attribution.KINDS`); what
  was alive before the step (parameters, optimizer state, the batch) comes from tensor sizes
  passed in, and a block whose ptr is a parameter's final ``.grad`` storage, allocated and never
  freed in the step, is a gradient.

**Logits detector**: every allocation of at least N·V bytes (half the bf16 N×V logits) whose
shape, inferred from the allocating op's recorded input shapes, ends in V with at least N/4
rows (or, when no shape is known, whose bytes are a whole number of N×V elements), excluding
parameter gradients, is listed with its size, dtype, module, op and the innermost source line
outside torch, and whether it was **kept for backward** (allocated before ``loss.backward()``
began and still alive after) — what materialised logits do and a fused loss never does.
:func:`fusedce_profiler.instrument.tracing.attribution.logits_verdict` reads the verdict from that list.

What is returned is an :class:`fusedce_profiler.instrument.tracing.attribution.Attribution`; nothing here renders.
Public API: :class:`StepTracer`, :func:`attribute`.
"""
from __future__ import annotations

import torch
from torch import nn

from fusedce_profiler.instrument.tracing.attribution import (FUSEDCE_FORWARD_OPS, FUSEDCE_KEPT, FUSEDCE_KEPT_SOURCE,
                                                              KINDS, Attribution, KindBytes, LargeTensor, ModuleBytes)
from fusedce_profiler.instrument.tracing.quiet import quiet_third_party, start_profiler
from fusedce_profiler.instrument.tracing.classify import EVENT, Classifier, Context, Probe, inside_backward, numel, walk

MARK_PREFIX = "fusedce.trace:"
LOSS_REGION = "fusedce.loss"


class StepTracer:
    """``with StepTracer() as tracer: ... tracer.mark("backward-start") ...`` around one step."""

    def __init__(self) -> None:
        self._prof = None

    def __enter__(self) -> "StepTracer":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True,
                             with_modules=True, record_shapes=True)
        start_profiler(self._prof)
        return self

    def __exit__(self, *exc) -> None:
        with quiet_third_party():
            self._prof.__exit__(*exc)

    @staticmethod
    def mark(name: str) -> None:
        with torch.profiler.record_function(MARK_PREFIX + name):
            pass

    @staticmethod
    def loss_region():
        """Context manager marking the loss call: allocations inside it are loss internals."""
        return torch.profiler.record_function(LOSS_REGION)

    @property
    def profiler(self):
        return self._prof


def attention_shape(config) -> tuple[list[int], int]:
    """(attention head counts, layer count) a model ``config`` names (Hugging Face's or GPT-2's
    attribute names; ``([], 0)`` for ``None``): B·heads·T·T tensors of these head counts are
    attention scores, for :func:`attribute`."""
    heads = [h for h in (getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None),
                         getattr(config, "n_head", None)) if isinstance(h, int) and h > 0]
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    return heads, int(layers)


def attribute(tracer: StepTracer, *, device: torch.device, model: nn.Module | None, head: nn.Module | None,
              static: dict[str, int], grad_ptrs: set[int], batch: int, seq: int, vocab: int,
              heads: list[int], layers: int = 0, top_modules: int = 12) -> Attribution:
    """Attribute the traced step's peak (see the module docstring).

    ``static``: bytes alive when the step began, by kind (``parameters``, ``optimizer
    state``, ``batch and other static``); ``grad_ptrs``: data pointers of the parameters'
    ``.grad`` storages after the step.
    """
    roots = tracer.profiler.profiler.kineto_results.experimental_event_tree()
    classifier = Classifier(model, head, batch, seq, heads)
    marks: list[tuple[int, str]] = []
    loss_intervals: list[tuple[int, int]] = []
    allocations = []
    forward_ops: dict[int, Context] = {}
    for node in walk(roots):
        if node.tag == EVENT.TorchOp:
            name = node.name
            if name.startswith(MARK_PREFIX):
                marks.append((node.start_time_ns, name[len(MARK_PREFIX):]))
            elif name == LOSS_REGION:
                loss_intervals.append((node.start_time_ns, node.end_time_ns))
        elif node.tag == EVENT.Allocation:
            fields = node.extra_fields
            if _same_device(fields.device, device):
                allocations.append(node)
    marks.sort()
    # Forward ops with a sequence number: the module context their backward inherits.
    for node in walk(roots):
        if node.tag == EVENT.TorchOp and not node.name.startswith(("autograd::", MARK_PREFIX)):
            seq_nr = node.extra_fields.sequence_number
            if seq_nr is not None and seq_nr >= 0 and seq_nr not in forward_ops:
                ctx, _ = classifier.context(Probe(node), loss_intervals)
                if not inside_backward(node):
                    forward_ops[seq_nr] = ctx
    allocations.sort(key=lambda n: (n.start_time_ns, n.extra_fields.id))

    backward_start = next((t for t, name in marks if name == "backward-start"), None)
    static_total = sum(static.values())
    live: dict[int, tuple[int, int]] = {}  # ptr -> (bytes, index into allocations)
    total = static_total
    static_freed = 0
    peak, peak_index, peak_static_freed = total, -1, 0
    freed_at: dict[int, int] = {}
    for index, node in enumerate(allocations):
        fields = node.extra_fields
        size, ptr = fields.alloc_size, fields.ptr
        if size > 0:
            live[ptr] = (size, index)
            total += size
            if total > peak:
                peak, peak_index, peak_static_freed = total, index, static_freed
        elif size < 0:
            if ptr in live:
                _, alloc_index = live.pop(ptr)
                freed_at[alloc_index] = node.start_time_ns
            else:  # a block from before the step (e.g. a tensor of the previous step)
                static_freed += -size
            total += size
    # Blocks alive at the peak: allocated at or before peak_index and not freed by then.
    alive: set[int] = set()
    open_blocks: dict[int, int] = {}
    for index, node in enumerate(allocations[:peak_index + 1]):
        fields = node.extra_fields
        if fields.alloc_size > 0:
            open_blocks[fields.ptr] = index
        elif fields.alloc_size < 0:
            open_blocks.pop(fields.ptr, None)
    alive = set(open_blocks.values())
    final_blocks = {index for _, index in live.values()}
    peak_time = allocations[peak_index].start_time_ns if peak_index >= 0 else 0
    peak_phase = _phase_at(marks, peak_time) if peak_index >= 0 else "start"

    kinds = {k: KindBytes(k, 0) for k in KINDS}
    kinds["parameters"].bytes = static.get("parameters", 0)
    kinds["optimizer state"].bytes = static.get("optimizer state", 0)
    kinds["batch and other static"].bytes = static.get("batch and other static", 0) - peak_static_freed
    modules: dict[tuple[str, str], int] = {}
    large: list[LargeTensor] = []
    threshold = batch * seq * vocab
    contexts: dict[int, Context] = {}

    def context_of(index: int) -> Context:
        if index not in contexts:
            node = allocations[index]
            ctx, seq_nr = classifier.context(node, loss_intervals)
            if ctx.backward and not ctx.kind:
                inherited = forward_ops.get(seq_nr) if seq_nr is not None else None
                if inherited is not None:
                    ctx = Context(inherited.kind, inherited.module, ctx.source or inherited.source,
                                   ctx.op, ctx.shape, ctx.dtype, True)
                    if inherited.source and not ctx.source.startswith("backward of"):
                        ctx.source = f"backward of {inherited.source}"
                if not ctx.kind:
                    ctx.kind = "backward temporaries"
            if not ctx.kind:
                ctx.kind = "other activations"
            contexts[index] = ctx
        return contexts[index]

    for index in alive:
        node = allocations[index]
        size = node.extra_fields.alloc_size
        if node.extra_fields.ptr in grad_ptrs and index in final_blocks:
            kinds["gradients"].bytes += size
            kinds["gradients"].blocks += 1
            continue
        ctx = context_of(index)
        kind = ctx.kind
        if kind == "attention (other)" and _is_scores(size, classifier.score_elements):
            kind = "attention scores/probabilities"
        entry = kinds[kind]
        entry.bytes += size
        entry.blocks += 1
        if ctx.backward:
            entry.backward_bytes += size
        modules[(ctx.module or "(outside modules)", kind)] = modules.get((ctx.module or "(outside modules)", kind),
                                                                         0) + size

    for index, node in enumerate(allocations):
        fields = node.extra_fields
        size = fields.alloc_size
        if size < threshold or threshold <= 0:
            continue
        if fields.ptr in grad_ptrs and index in final_blocks:
            continue
        ctx = context_of(index)
        found = _logits_like(size, ctx, batch * seq, vocab)
        if found is None:
            continue
        dtype, dtype_from = found
        if backward_start is None:
            kept = False
        else:
            allocated_before = node.start_time_ns < backward_start
            freed = freed_at.get(index)
            kept = allocated_before and (freed is None or freed > backward_start)
        large.append(LargeTensor(bytes=size, dtype=dtype, shape=ctx.shape, module=ctx.module or "(outside modules)",
                                 kind=ctx.kind, op=ctx.op, source=ctx.source or "(torch internals)",
                                 phase=_phase_at(marks, node.start_time_ns), kept_for_backward=kept,
                                 alive_at_peak=index in alive, dtype_from=dtype_from))
    large.sort(key=lambda t: (not t.kept_for_backward, -t.bytes))

    kind_list = [kinds[k] for k in KINDS]
    module_list = sorted((ModuleBytes(m, k, b) for (m, k), b in modules.items()), key=lambda m: -m.bytes)
    return Attribution(peak_bytes=sum(k.bytes for k in kind_list), peak_phase=peak_phase, kinds=kind_list,
                       modules=module_list[:top_modules], large_tensors=large[:16], threshold_bytes=threshold,
                       tokens=batch * seq, vocab=vocab, batch=batch, seq=seq, heads=sorted(set(heads)),
                       layers=layers, events=len(allocations))


def _same_device(alloc_device, device: torch.device) -> bool:
    try:
        return alloc_device.type == device.type and (device.type == "cpu" or device.index is None
                                                     or alloc_device.index == device.index)
    except AttributeError:
        return True


def _phase_at(marks: list[tuple[int, str]], t: int) -> str:
    phase = "start"
    for when, name in marks:
        if when <= t:
            phase = name
        else:
            break
    return phase


def _is_scores(size: int, score_elements: set[int]) -> bool:
    for elements in score_elements:
        for itemsize in (1, 2, 4):
            expected = elements * itemsize
            if expected and abs(size - expected) < 512:
                return True
    return False


def _logits_like(size: int, ctx: Context, tokens: int, vocab: int) -> tuple[str, str] | None:
    """(dtype, how known) if an allocation of ``size`` bytes looks like (a large part of) the logits.
    fusedce's forward op allocates the logits an explicit budget keeps for the backward, (N, K) of a
    part of the vocabulary, at one line of ``fusedce/custom_op.py``; its blocks and converted chunks
    are allocated elsewhere and judged by the rules below."""
    if ctx.op in FUSEDCE_FORWARD_OPS and ctx.source.startswith(FUSEDCE_KEPT_SOURCE):
        return ("compute dtype", FUSEDCE_KEPT)
    if ctx.shape:
        shape = ctx.shape
        if shape[-1] != vocab or numel(shape[:-1]) * 4 < tokens:
            return None
        elements = numel(shape)
        itemsize = round(size / elements) if elements else 0
        name = {1: "int8/bool", 2: ctx.dtype if ctx.dtype in ("bf16", "fp16") else "bf16", 4: "fp32",
                8: "fp64"}.get(itemsize)
        return (name or f"{itemsize}-byte", "shape")
    ratio = size / (tokens * vocab)
    for itemsize, name in ((2, "bf16/fp16"), (4, "fp32")):
        if abs(ratio - itemsize) * tokens * vocab < 512 + tokens * 8:
            return (name, "bytes ÷ N·V")
    return None
