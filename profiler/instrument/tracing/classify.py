"""Classifying one allocation of a ``torch.profiler`` event tree by module, kind, op and source.

An ``Allocation`` node's ``parent`` chain holds ``TorchOp`` nodes (``aten::_softmax`` …) and
``PyCall`` frames; a frame with ``extra_fields.module`` is a module's call, its ``self_ptr`` is
``id(module)``, named through ``model.named_modules()``. :class:`Classifier` gives the innermost
module that has a kind (:mod:`fusedce_profiler.instrument.tracing.attribution` lists the kinds), the allocating op, the
output shape inferred from the op's recorded input shapes, its dtype, the innermost source line
outside torch, whether the allocation is under an autograd ``evaluate_function`` (backward) and
that node's ``sequence_number``. Allocations inside a loss interval, or under a
``*cross_entropy*``/``*loss*`` frame, are loss internals.

Used by :func:`fusedce_profiler.instrument.tracing.trace.attribute`. Public API: :class:`Context`, :class:`Classifier`,
:class:`Probe`, :data:`EVENT`, :func:`walk`, :func:`inside_backward`, :func:`numel`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from fusedce_profiler.instrument.tracing.names import FREED, readable

_TORCH_DIR = os.path.dirname(torch.__file__)
_ELEMENTWISE_HINTS = ("_to_copy", "copy", "softmax", "log_softmax", "tanh", "div", "mul", "add", "sub", "exp",
                      "clone", "contiguous", "float", "where", "masked_fill", "neg", "sigmoid", "gelu", "silu",
                      "cat", "index", "fill", "zeros_like", "empty_like", "ones_like", "sum", "logsumexp")


@dataclass
class Context:
    """One allocation's classification: ``kind`` (``""`` when none), module name, source line, op,
    inferred output ``shape`` (``None`` when unknown), ``dtype`` name and whether it is in backward."""

    kind: str
    module: str
    source: str
    op: str
    shape: list[int] | None
    dtype: str | None
    backward: bool


def walk(roots):
    """Every node of the event tree under ``roots``, depth first, in order."""
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
        return max(tensors, key=lambda s: numel(s))
    return None


def numel(shape) -> int:
    """The number of elements of ``shape`` (a list of ints)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


class Classifier:
    """Kinds and names of ``model``'s modules (``head`` is the LM head; ``heads`` the attention
    head counts, for the B·heads·T·T score sizes in :attr:`score_elements`)."""

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

    def context(self, node, loss_intervals) -> Context:
        """Classify an allocation by its parent chain (forward ops and module frames)."""
        op_name, shape, dtype, source = "", None, None, ""
        kind = module = None
        backward = False
        seq_nr = None
        loss_frame = optimizer = False
        parent = node.parent
        first_op = True
        while parent is not None:
            tag = parent.tag
            if tag == EVENT.TorchOp:
                name = parent.name
                if name.startswith(OPTIMIZER_STEP_PREFIX):
                    optimizer = True
                elif name.startswith("autograd::engine::evaluate_function:"):
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
            elif tag == EVENT.PyCall:
                fields = parent.extra_fields
                mod = fields.module
                if mod is not None and kind is None:
                    k = self.module_kind(mod.self_ptr, mod.cls_name)
                    if k is not None:
                        kind, module = k, self.names.get(mod.self_ptr, mod.cls_name)
                    elif module is None and mod.self_ptr != self.model_id:
                        module = self.names.get(mod.self_ptr, mod.cls_name)
                site = fields.callsite
                file_name = readable(lambda: site.file_name) or FREED  # see tracing.names
                function_name = readable(lambda: site.function_name) or FREED
                if file_name.replace("\\", "/").rsplit("site-packages/", 1)[-1].startswith(OPTIMIZER_FILES):
                    optimizer = True
                if not source and not _is_torch_file(file_name) and file_name != FREED:
                    source = f"{_short(file_name)}:{site.line_number} ({function_name})"
                func = function_name.lower()
                if kind is None and ("cross_entropy" in func or func.endswith("loss") or "loss_" in func
                                     or "lce" in func):
                    loss_frame = True
            parent = parent.parent
        in_loss = any(a <= node.start_time_ns <= b for a, b in loss_intervals)
        if kind is None and (in_loss or loss_frame):
            kind = "loss internals"
        elif kind is None and optimizer:
            kind = "optimizer temporaries"
        return Context(kind or "", module or "", source, op_name, shape, dtype, backward), seq_nr


EVENT = torch._C._profiler._EventType
#: The record-function every ``torch.optim`` optimizer's ``step()`` runs under
#: (``Optimizer.step#AdamW.step``): what it allocates is the optimizer's temporaries.
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
#: Python frames of ``torch.optim`` (as the profiler names their files): the optimizer's own work.
OPTIMIZER_FILES = ("torch/optim/",)


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


class Probe:
    """A stand-in allocation node placed under ``op`` (to classify an op's own context)."""

    def __init__(self, op) -> None:
        self.parent = op
        self.start_time_ns = op.start_time_ns


def inside_backward(node) -> bool:
    """Whether ``node`` runs under an autograd ``evaluate_function`` (a backward node)."""
    parent = node.parent
    while parent is not None:
        if parent.tag == EVENT.TorchOp and parent.name.startswith("autograd::engine::evaluate_function:"):
            return True
        parent = parent.parent
    return False
