"""The public loss: ``linear_cross_entropy`` and ``LinearCrossEntropyLoss``."""
from __future__ import annotations

import torch
from torch import nn

from fusedce import custom_op
from fusedce.budget_warning import warn_if_unmet
from fusedce.matmul import split_k_sm_count
from fusedce.options import IGNORE_INDEX, IMPLS, LossOptions
from fusedce.planner import check_options, plan_chunks
from fusedce.validation import check_tensors, raise_on_out_of_range_targets

_AUTOCASTABLE = (torch.float32, torch.bfloat16, torch.float16)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    impl: str = "auto",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    memory_budget: int | float | str | None = None,
    strategy: str = "auto",
    grad_weight_accumulation: str = "fp32",
    validate_targets: bool | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` without materialising the N×V logits.

    Value, in exact arithmetic: ``logits = hidden @ weight.T + bias``; with ``softcap``,
    ``logits = softcap * tanh(logits / softcap)``; per token
    ``F.cross_entropy(logits, target, label_smoothing=...) + z_loss * logsumexp(logits)**2``,
    0 at ``ignore_index``; ``mean`` divides by the number of non-ignored tokens (NaN if
    there are none, like ``F.cross_entropy``), ``sum`` sums, ``none`` returns ``target``'s shape.

    Args:
        hidden: (..., H) float16/bfloat16/float32 (float64 with impl='torch').
        weight: (V, H) floating; its gradient comes back in its own dtype.
        target: hidden.shape[:-1], integer class indices in [0, V) or ``ignore_index``.
        bias: optional (V,).
        impl: "auto" (Triton on CUDA tensors, PyTorch otherwise), "torch" or "triton"
            (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``).
        chunk_size / vocab_chunk_size: cap the tokens / vocabulary entries per block.
        memory_budget: the time–memory knob: what the step may hold besides its inputs and
            the gradients it returns (the *floor*: grad_hidden + grad_weight bytes). One of
            ``None``/``"default"`` (a tenth of the floor plus 96 MiB: ≤ 1.1 × floor + 128 MiB),
            ``"min"`` (5 % of the floor: the smallest blocks, ≤ 1.05 × floor where 1024 × 1024
            blocks allow), ``"fast"`` (7/8 of N·V·2 bytes in bf16, below what torch.compile holds:
            gradients computed in forward where they fit and H ≥ 2048; where they do not, all in
            bf16 with the Triton kernels on a GPU with tensor-memory copies, the logits of part of
            the vocabulary kept from forward for backward; below H = 2048, wider blocks),
            a float ``f ≥ 1.0`` (a peak of f × floor), or an int (bytes). An explicit budget may hold
            memory from the forward to the backward; one in numbers that the smallest blocks exceed
            warns once (:class:`fusedce.MemoryBudgetWarning`, with the predicted peak).
            See :mod:`fusedce.planner` and DESIGN.md.
        strategy: "auto" (the planner picks from the budget), "recompute" (logits recomputed
            in backward: 8·N·H·V FLOPs, any reduction, any number of backwards, nothing but
            per-token vectors held from the forward) or
            "precompute" (mean/sum only: gradients computed in forward for an upstream
            gradient of 1, scaled in backward: 6·N·H·V FLOPs, the gradients' memory held from
            forward on, one backward per forward; not for float16 compute).
        grad_weight_accumulation: how a bf16/fp16 weight's gradient is summed over row
            chunks: "fp32" (default, exact: one rounding of an fp32 sum; all rows in one
            chunk, or a V×H fp32 accumulator) or "per_chunk" (added into the bf16/fp16
            gradient once per row chunk, Liger-Kernel's policy: row chunks at no memory cost;
            grad_weight's error grows with the number of row chunks, see DESIGN.md). No effect on an fp32 weight (always summed exactly in place).
        validate_targets: raise IndexError on out-of-range targets. Default: on CPU always;
            on CUDA never (that read is a host sync) — out-of-range tokens get a NaN loss.

    Returns:
        fp32 loss (fp64 for fp64 inputs): a scalar, or ``target.shape`` for ``none``.

    Under ``torch.autocast`` the matrix products run in the autocast dtype (fp32 master
    weights are converted chunk by chunk, into buffers the memory budget counts) and every
    reduction accumulates in fp32.
    """
    opts = LossOptions(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap)
    check_options(chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget,
                  strategy=strategy, grad_weight_accumulation=grad_weight_accumulation)
    check_tensors(hidden, weight, target, bias)
    impl = _resolve_impl(impl, hidden.device)
    compute_dtype = _compute_dtype(hidden, weight)
    if impl == "triton" and compute_dtype not in _AUTOCASTABLE:
        raise TypeError(f"impl='triton' computes in float32/bfloat16/float16; got inputs needing {compute_dtype}")

    vocab, h = weight.shape
    hidden2d = hidden.reshape(-1, h)
    target1d = target.reshape(-1).to(torch.int64)
    if validate_targets or (validate_targets is None and hidden.device.type != "cuda"):
        raise_on_out_of_range_targets(target1d, vocab, ignore_index)
    needs = _needs_grad(hidden, weight, bias)
    cuda = hidden.device.type == "cuda"
    plan = plan_chunks(hidden2d.shape[0], h, vocab, hidden_dtype=hidden.dtype, weight_dtype=weight.dtype,
                       compute_dtype=compute_dtype, chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
                       memory_budget=memory_budget, strategy=strategy,
                       grad_weight_accumulation=grad_weight_accumulation, scalar_loss=reduction != "none",
                       needs_grad=any(needs), cuda=cuda,
                       sm_count=split_k_sm_count(hidden.device, compute_dtype) if cuda else None,
                       tiled=impl == "triton" and custom_op.tiles_planned(hidden2d, weight, compute_dtype))
    if any(needs) and chunk_size is None and vocab_chunk_size is None:
        warn_if_unmet(memory_budget, plan, hidden2d.shape[0], h, vocab, hidden_dtype=hidden.dtype,
                      weight_dtype=weight.dtype, compute_dtype=compute_dtype, has_bias=bias is not None, impl=impl)

    if plan.strategy == "precompute":
        loss, *_ = custom_op.loss_and_grads_op(hidden2d, weight, target1d, bias, ignore_index, reduction,
                                               float(label_smoothing), float(z_loss), opts.softcap_value,
                                               compute_dtype, impl, plan.rows, plan.split_k, plan.per_chunk, *needs)
        return loss
    per_token, _, _ = custom_op.forward_op(hidden2d, weight, target1d, bias, ignore_index, float(label_smoothing),
                                           float(z_loss), opts.softcap_value, compute_dtype, impl, plan.rows,
                                           plan.cols, plan.per_chunk, plan.tiled, plan.hidden_rows, plan.hidden_cols,
                                           plan.kept_cols)
    return _reduce(per_token, target, target1d, reduction, ignore_index)


class LinearCrossEntropyLoss(nn.Module):
    """Module form of :func:`linear_cross_entropy`, called as ``loss_fn(hidden, weight, target, bias=None)``.

    Holds the options; the weight stays with the layer that owns it (e.g. ``lm_head.weight``).
    """

    def __init__(
        self,
        *,
        ignore_index: int = IGNORE_INDEX,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: float | None = None,
        impl: str = "auto",
        chunk_size: int | None = None,
        vocab_chunk_size: int | None = None,
        memory_budget: int | float | str | None = None,
        strategy: str = "auto",
        grad_weight_accumulation: str = "fp32",
        validate_targets: bool | None = None,
    ) -> None:
        super().__init__()
        LossOptions(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                    z_loss=z_loss, softcap=softcap)  # validate early
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        check_options(chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget,
                      strategy=strategy, grad_weight_accumulation=grad_weight_accumulation)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.impl = impl
        self.chunk_size = chunk_size
        self.vocab_chunk_size = vocab_chunk_size
        self.memory_budget = memory_budget
        self.strategy = strategy
        self.grad_weight_accumulation = grad_weight_accumulation
        self.validate_targets = validate_targets

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear_cross_entropy(
            hidden, weight, target, bias, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap, impl=self.impl,
            chunk_size=self.chunk_size, vocab_chunk_size=self.vocab_chunk_size,
            memory_budget=self.memory_budget, strategy=self.strategy,
            grad_weight_accumulation=self.grad_weight_accumulation, validate_targets=self.validate_targets,
        )

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, softcap={self.softcap}, "
                f"impl={self.impl!r}, memory_budget={self.memory_budget!r}, strategy={self.strategy!r}")


def _reduce(per_token: torch.Tensor, target: torch.Tensor, target1d: torch.Tensor, reduction: str,
            ignore_index: int) -> torch.Tensor:
    """The loss of ``reduction`` from the per-token losses (N,): ``none`` in ``target``'s shape;
    ``mean`` divides the sum by the count of non-ignored tokens (``target1d``, (N,)), kept on
    the device so there is no host synchronisation."""
    if reduction == "none":
        return per_token.view(target.shape)
    total = per_token.sum()
    if reduction == "sum":
        return total
    count = (target1d != ignore_index).sum()
    return total / count.to(total.dtype)


def _needs_grad(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, bool, bool]:
    """Whether autograd will ask for (grad_hidden, grad_weight, grad_bias)."""
    if not torch.is_grad_enabled():
        return False, False, False
    return hidden.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad


def _resolve_impl(impl: str, device: torch.device) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and custom_op.triton_available(device) else "torch"
    if impl == "triton" and not custom_op.triton_available(device):
        raise ValueError(
            f"impl='triton' needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 and triton installed); "
            f"got tensors on {device}"
        )
    return impl


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype of the matrix products: the autocast dtype when autocast is on for the
    device (and the inputs are autocast-eligible), else the promoted input dtype."""
    device_type = hidden.device.type
    if (device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type)
            and hidden.dtype in _AUTOCASTABLE and weight.dtype in _AUTOCASTABLE):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)
