"""Measured attribution of a training step's peak, by module and kind, and the logits detector.

:class:`StepTracer` wraps one training step in ``torch.profiler.profile(profile_memory=True,
with_stack=True, with_modules=True, record_shapes=True)`` (CPU events: allocations on every
device are reported by the allocator on the host, so no CUDA activity is needed) and
:func:`attribute` walks ``prof.profiler.kineto_results.experimental_event_tree()``:

- every ``Allocation`` node (``alloc_size`` > 0 allocates, < 0 frees; ``ptr``) of the step's
  device moves a running total whose maximum is the traced peak; blocks are tracked by ptr;
- each allocation's ``parent`` chain holds ``TorchOp`` nodes (``aten::_softmax`` …) and
  ``PyCall`` frames; a frame with ``extra_fields.module`` is a module's call, its ``self_ptr``
  is ``id(module)``, named through ``model.named_modules()``. The innermost module that has a
  kind (below) classifies a forward allocation;
- a backward allocation (under ``autograd::engine::evaluate_function: XBackward0``) carries
  the ``sequence_number`` of the forward op that created the node: it gets that op's module
  and kind (recomputation under activation checkpointing has its own module frames);
- the blocks alive at the peak are split into kinds (:data:`KINDS`); what was alive before
  the step (parameters, optimizer state, the batch) comes from tensor sizes passed in, and a
  block whose ptr is a parameter's final ``.grad`` storage, allocated and never freed in the
  step, is a gradient.

Kinds of activations: the innermost module's class — ``Embedding``; ``*Attention*``/``*Attn*``
(within it, tensors of B·heads·T·T elements are the attention scores/probabilities); ``*MLP*``
/ ``*FeedForward*``; ``*Norm*``; the located LM head; allocations inside the loss region (the
step's ``loss`` record-function, or a frame of a ``*cross_entropy*``/``*loss*`` function in the
model) are loss internals; unmapped backward allocations are backward temporaries.

**Logits detector**: every allocation of at least N·V bytes (half the bf16 N×V logits) whose
shape, inferred from the allocating op's recorded input shapes, ends in V with at least N/4
rows (or, when no shape is known, whose bytes are a whole number of N×V elements), excluding
parameter gradients, is listed with its size, dtype, module, op and the innermost source line
outside torch, and whether it was **kept for backward** (allocated before ``loss.backward()``
began and still alive after) — what materialised logits do and a fused loss never does.

Everything returned is plain dataclasses (JSON via ``dataclasses.asdict``); nothing here
renders. Public API: :data:`KINDS`, :data:`GROUPS`, :class:`StepTracer`, :class:`Attribution`,
:class:`KindBytes`, :class:`ModuleBytes`, :class:`LargeTensor`, :func:`attribute`,
:func:`logits_verdict`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

MARK_PREFIX = "fusedce.trace:"
LOSS_REGION = "fusedce.loss"

STATIC_KINDS = ("parameters", "optimizer state", "batch and other static")
ACTIVATION_KINDS = ("embedding", "attention scores/probabilities", "attention (other)", "MLP", "norms",
                    "LM-head input/logits", "loss internals", "backward temporaries", "other activations")
KINDS = STATIC_KINDS + ("gradients",) + ACTIVATION_KINDS

#: Kinds grouped by what a back-end may replace: the loss's saving is the change in "LM-head/loss".
GROUPS = {
    "LM-head/loss": ("LM-head input/logits", "loss internals"),
    "attention": ("attention scores/probabilities", "attention (other)"),
    "MLP": ("MLP",),
    "norms": ("norms",),
    "embedding": ("embedding",),
    "parameters, gradients, optimizer": ("parameters", "gradients", "optimizer state"),
    "other": ("batch and other static", "backward temporaries", "other activations"),
}

_TORCH_DIR = os.path.dirname(torch.__file__)
_ELEMENTWISE_HINTS = ("_to_copy", "copy", "softmax", "log_softmax", "tanh", "div", "mul", "add", "sub", "exp",
                      "clone", "contiguous", "float", "where", "masked_fill", "neg", "sigmoid", "gelu", "silu",
                      "cat", "index", "fill", "zeros_like", "empty_like", "ones_like", "sum", "logsumexp")


@dataclass
class KindBytes:
    """Bytes of one kind alive at the peak; ``backward_bytes`` of them were allocated in backward."""

    kind: str
    bytes: int
    backward_bytes: int = 0
    blocks: int = 0


@dataclass
class ModuleBytes:
    """Bytes alive at the peak that one module (by name) allocated, with its kind."""

    module: str
    kind: str
    bytes: int


@dataclass
class LargeTensor:
    """One allocation of at least N·V bytes (the logits detector)."""

    bytes: int
    dtype: str
    shape: list[int] | None
    module: str
    kind: str
    op: str
    source: str
    phase: str
    kept_for_backward: bool
    alive_at_peak: bool
    dtype_from: str = "shape"


@dataclass
class Attribution:
    """A traced step's peak split by kind and module (bytes, absolute).

    ``peak_bytes`` = Σ ``kinds`` (exactly, by construction); ``metered_peak_bytes`` is the
    :class:`~profiler.protocol.MemoryMeter`'s authoritative peak of the measured step (set by
    the caller) and ``relative_gap`` their difference relative to it. ``peak_phase`` is the
    phase holding the traced peak. ``large_tensors``: the logits detector's findings, with
    ``threshold_bytes`` = N·V; ``tokens``, ``vocab``, ``batch``, ``seq``, ``heads`` the shapes used.
    """

    peak_bytes: int
    peak_phase: str
    kinds: list[KindBytes]
    modules: list[ModuleBytes]
    large_tensors: list[LargeTensor]
    threshold_bytes: int
    tokens: int
    vocab: int
    batch: int
    seq: int
    heads: list[int]
    layers: int = 0
    metered_peak_bytes: int | None = None
    events: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def relative_gap(self) -> float | None:
        if not self.metered_peak_bytes:
            return None
        return (self.peak_bytes - self.metered_peak_bytes) / self.metered_peak_bytes

    def kind_bytes(self, kind: str) -> int:
        return next((k.bytes for k in self.kinds if k.kind == kind), 0)

    def group_bytes(self, group: str) -> int:
        return sum(self.kind_bytes(k) for k in GROUPS[group])

    @classmethod
    def from_dict(cls, raw: dict) -> "Attribution":
        raw = dict(raw)
        raw["kinds"] = [KindBytes(**k) for k in raw["kinds"]]
        raw["modules"] = [ModuleBytes(**m) for m in raw["modules"]]
        raw["large_tensors"] = [LargeTensor(**t) for t in raw["large_tensors"]]
        return cls(**raw)


class StepTracer:
    """``with StepTracer() as tracer: ... tracer.mark("backward-start") ...`` around one step."""

    def __init__(self) -> None:
        self._prof = None

    def __enter__(self) -> "StepTracer":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True,
                             with_modules=True, record_shapes=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
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


# --- walking the event tree ------------------------------------------------------------------

@dataclass
class _Context:
    kind: str
    module: str
    source: str
    op: str
    shape: list[int] | None
    dtype: str | None
    backward: bool


def _walk(roots):
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _dtype_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
            torch.int64: "int64", torch.bool: "bool"}.get(dtype, str(dtype).replace("torch.", ""))


def _inputs(op_node) -> list:
    try:
        return list(op_node.extra_fields.inputs)
    except AttributeError:
        return []


def _tensor_inputs(op_node) -> list:
    return [i for i in _inputs(op_node) if hasattr(i, "sizes") and hasattr(i, "dtype")]


def _infer_shape(op_name: str, inputs: list) -> list[int] | None:
    """The output shape of common ops from their input shapes (``None`` when unknown)."""
    tensors = [list(t.sizes) for t in inputs if hasattr(t, "sizes")]
    if not tensors:
        return None
    name = op_name.split("::")[-1]
    if name in ("mm", "matmul", "bmm") and len(tensors) >= 2 and len(tensors[0]) >= 2 and len(tensors[1]) >= 2:
        return tensors[0][:-1] + [tensors[1][-1]]
    if name == "addmm" and len(tensors) >= 3:
        return [tensors[1][0], tensors[2][-1]]
    if name == "linear" and len(tensors) >= 2 and len(tensors[1]) == 2:
        return tensors[0][:-1] + [tensors[1][0]]
    if any(hint in name for hint in _ELEMENTWISE_HINTS):
        return max(tensors, key=lambda s: _numel(s))
    return None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class _Classifier:
    def __init__(self, model: nn.Module | None, head: nn.Module | None, batch: int, seq: int,
                 heads: list[int]) -> None:
        self.names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        self.kinds: dict[int, str | None] = {}
        self.head_id = id(head) if head is not None else None
        self.model_id = id(model) if model is not None else None
        self.score_elements = {batch * h * seq * seq for h in heads} if seq > 1 else set()

    def module_kind(self, self_ptr: int, cls_name: str) -> str | None:
        if self_ptr == self.head_id:
            return "LM-head input/logits"
        name = cls_name.lower()
        if "embedding" in name:
            return "embedding"
        if "norm" in name:
            return "norms"
        if "attention" in name or name.endswith("attn") or "selfattn" in name:
            return "attention (other)"
        if "mlp" in name or "feedforward" in name or "ffn" in name or name.endswith("ff"):
            return "MLP"
        return None

    def context(self, node, loss_intervals) -> _Context:
        """Classify an allocation by its parent chain (forward ops and module frames)."""
        op_name, shape, dtype, source = "", None, None, ""
        kind = module = None
        backward = False
        seq_nr = None
        loss_frame = False
        parent = node.parent
        first_op = True
        while parent is not None:
            tag = parent.tag
            if tag == _EVENT.TorchOp:
                name = parent.name
                if name.startswith("autograd::engine::evaluate_function:"):
                    backward = True
                    if seq_nr is None:
                        seq_nr = parent.extra_fields.sequence_number
                elif first_op or shape is None:
                    inputs = _tensor_inputs(parent)
                    if name not in ("aten::empty", "aten::empty_strided", "aten::resize_", "aten::empty_like",
                                    "aten::new_empty", "aten::new_empty_strided", "aten::zeros", "aten::ones"):
                        if not op_name:
                            op_name = name
                        if shape is None:
                            shape = _infer_shape(name, inputs)
                            if inputs and dtype is None:
                                dtype = _dtype_name(inputs[0].dtype)
                    first_op = False
            elif tag == _EVENT.PyCall:
                fields = parent.extra_fields
                mod = fields.module
                if mod is not None and kind is None:
                    k = self.module_kind(mod.self_ptr, mod.cls_name)
                    if k is not None:
                        kind, module = k, self.names.get(mod.self_ptr, mod.cls_name)
                    elif module is None and mod.self_ptr != self.model_id:
                        module = self.names.get(mod.self_ptr, mod.cls_name)
                site = fields.callsite
                file_name = site.file_name
                if not source and not _is_torch_file(file_name):
                    source = f"{_short(file_name)}:{site.line_number} ({site.function_name})"
                func = site.function_name.lower()
                if kind is None and ("cross_entropy" in func or func.endswith("loss") or "loss_" in func
                                     or "lce" in func):
                    loss_frame = True
            parent = parent.parent
        in_loss = any(a <= node.start_time_ns <= b for a, b in loss_intervals)
        if kind is None and (in_loss or loss_frame):
            kind = "loss internals"
        return _Context(kind or "", module or "", source, op_name, shape, dtype, backward), seq_nr


_EVENT = torch._C._profiler._EventType


def _is_torch_file(name: str) -> bool:
    # The profiler names files under site-packages relative to it ("torch/nn/functional.py").
    return (name.startswith(("torch/", "<", _TORCH_DIR)) or "/site-packages/torch/" in name
            or "/dist-packages/torch/" in name)


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    cwd = os.getcwd().replace("\\", "/") + "/"
    return path[len(cwd):] if path.startswith(cwd) else "/".join(parts[-3:])


def attribute(tracer: StepTracer, *, device: torch.device, model: nn.Module | None, head: nn.Module | None,
              static: dict[str, int], grad_ptrs: set[int], batch: int, seq: int, vocab: int,
              heads: list[int], layers: int = 0, top_modules: int = 12) -> Attribution:
    """Attribute the traced step's peak (see the module docstring).

    ``static``: bytes alive when the step began, by kind (``parameters``, ``optimizer
    state``, ``batch and other static``); ``grad_ptrs``: data pointers of the parameters'
    ``.grad`` storages after the step.
    """
    roots = tracer.profiler.profiler.kineto_results.experimental_event_tree()
    classifier = _Classifier(model, head, batch, seq, heads)
    marks: list[tuple[int, str]] = []
    loss_intervals: list[tuple[int, int]] = []
    allocations = []
    forward_ops: dict[int, _Context] = {}
    for node in _walk(roots):
        if node.tag == _EVENT.TorchOp:
            name = node.name
            if name.startswith(MARK_PREFIX):
                marks.append((node.start_time_ns, name[len(MARK_PREFIX):]))
            elif name == LOSS_REGION:
                loss_intervals.append((node.start_time_ns, node.end_time_ns))
        elif node.tag == _EVENT.Allocation:
            fields = node.extra_fields
            if _same_device(fields.device, device):
                allocations.append(node)
    marks.sort()
    # Forward ops with a sequence number: the module context their backward inherits.
    for node in _walk(roots):
        if node.tag == _EVENT.TorchOp and not node.name.startswith(("autograd::", MARK_PREFIX)):
            seq_nr = node.extra_fields.sequence_number
            if seq_nr is not None and seq_nr >= 0 and seq_nr not in forward_ops:
                ctx, _ = classifier.context(_Probe(node), loss_intervals)
                if not _inside_backward(node):
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
    contexts: dict[int, _Context] = {}

    def context_of(index: int) -> _Context:
        if index not in contexts:
            node = allocations[index]
            ctx, seq_nr = classifier.context(node, loss_intervals)
            if ctx.backward and not ctx.kind:
                inherited = forward_ops.get(seq_nr) if seq_nr is not None else None
                if inherited is not None:
                    ctx = _Context(inherited.kind, inherited.module, ctx.source or inherited.source,
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


class _Probe:
    """A stand-in allocation node placed under ``op`` (to classify an op's own context)."""

    def __init__(self, op) -> None:
        self.parent = op
        self.start_time_ns = op.start_time_ns


def _inside_backward(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.tag == _EVENT.TorchOp and parent.name.startswith("autograd::engine::evaluate_function:"):
            return True
        parent = parent.parent
    return False


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


def _logits_like(size: int, ctx: _Context, tokens: int, vocab: int) -> tuple[str, str] | None:
    """(dtype, how known) if an allocation of ``size`` bytes looks like (a large part of) the logits."""
    if ctx.shape:
        shape = ctx.shape
        if shape[-1] != vocab or _numel(shape[:-1]) * 4 < tokens:
            return None
        elements = _numel(shape)
        itemsize = round(size / elements) if elements else 0
        name = {1: "int8/bool", 2: ctx.dtype if ctx.dtype in ("bf16", "fp16") else "bf16", 4: "fp32",
                8: "fp64"}.get(itemsize)
        return (name or f"{itemsize}-byte", "shape")
    ratio = size / (tokens * vocab)
    for itemsize, name in ((2, "bf16/fp16"), (4, "fp32")):
        if abs(ratio - itemsize) * tokens * vocab < 512 + tokens * 8:
            return (name, "bytes ÷ N·V")
    return None


def logits_verdict(attribution: Attribution, *, naive: bool) -> tuple[str, str]:
    """(status, sentence) from the detector: ``materialised``, ``transient`` or ``none``.

    ``materialised``: a logits-sized tensor was kept from the forward into the backward (with
    ``naive`` that is the expected naive loss; otherwise the fused path is not active in this
    step). ``transient``: logits-sized blocks existed but none was kept for backward (a fused
    loss whose one chunk covers all N rows at a small size does this). ``none``: no tensor of
    N·V bytes or more existed at all — the fused path is active.
    """
    from_units = _fmt
    kept = [t for t in attribution.large_tensors if t.kept_for_backward]
    where = lambda t: (f"{from_units(t.bytes)} {t.dtype}" + (f" {tuple(t.shape)}" if t.shape else "")
                       + f" by {t.op or 'an op'} in {t.module} at {t.source}")
    n, v = attribution.tokens, attribution.vocab
    if kept:
        t = kept[0]
        more = f" (+{len(kept) - 1} more)" if len(kept) > 1 else ""
        if naive:
            return "materialised", (f"the N×V logits are materialised, as expected for the naive loss: {where(t)}"
                                    f"{more}, kept from the forward into the backward")
        return "materialised", (f"the fused path is not active in this step: a logits-sized tensor ({where(t)}"
                                f"{more}) was kept from the forward into the backward, as eager logits are")
    if attribution.large_tensors:
        t = attribution.large_tensors[0]
        return "transient", (f"no logits-sized tensor was kept for backward; {len(attribution.large_tensors)} "
                             f"transient block(s) of ≥ N·V = {n}×{v} bytes existed, the largest {where(t)} — "
                             "what a fused loss does when one chunk covers all N rows, not materialised logits")
    return "none", (f"no tensor of N·V = {from_units(attribution.threshold_bytes)} or more was allocated in the "
                    "step: the fused path is active (no logits materialised)")


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"
