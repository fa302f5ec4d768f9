"""The precompute strategy: the loss and its gradients in one pass over row chunks (6·N·H·V).

For a scalar loss (``mean``/``sum``) the gradients of the loss are those of an upstream
gradient of 1, times the real upstream gradient g (a scalar). So the forward pass computes
them for g = 1 and the backward only multiplies them by g, in place
(:func:`fusedce.custom_op.loss_and_grads_op`): no logit is computed twice.

Per row chunk i of ``plan.rows`` tokens, over the whole vocabulary (a logit's gradient needs
its row's finished log-sum-exp, so the block is ``rows × V``)::

    x   = h_i @ Wᵀ                     fp32 (R, V) block (cuBLAS, fp32 output)
    stats_i, lse_i                     BlockMath.chunk_stats over the block (left unchanged)
    d   = ∂loss/∂x                     BlockMath.logit_grad, in place over x, compute dtype;
                                       a token's factor is 1/count (mean) or 1 (sum)
    grad_bias          += 1ᵀ d         (fp32 sum)
    grad_hidden[i]      = d @ W        written once per row (split-K on CUDA when R·H is small)
    grad_weight        += dᵀ @ h_i     summed over row chunks: in the fp32 gradient itself
                                       (fp32 weight), written once (bf16/fp16 weight, one
                                       chunk), in an fp32 V×H accumulator ("fp32" policy) or
                                       in the bf16/fp16 gradient ("per_chunk" policy)

An fp32 weight under autocast is converted to the compute dtype once, whole (``V·H·c``
bytes: the planner only picks this strategy when that fits the budget). Deterministic: no
atomics, fixed summation orders. The block math is :mod:`fusedce.block_math`'s; the loss
formula and the token masks are :mod:`fusedce.passes`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fusedce.block_math import BlockMath
from fusedce.converter import Converter
from fusedce.matmul import matmul_into, split_k_matmul_into
from fusedce.options import LossOptions
from fusedce.passes import (_columns, _contiguous_vectors, _token_loss, _token_masks, _write_product,
                            accumulation_dtype, block_row_stride)
from fusedce.planner import ChunkPlan
from fusedce.stats import RowStats


def loss_and_gradients(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    opts: LossOptions,
    compute_dtype: torch.dtype,
    plan: ChunkPlan,
    block_math: BlockMath,
    *,
    need_hidden: bool = True,
    need_weight: bool = True,
    need_bias: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(loss, grad_hidden (N, H), grad_weight (V, H), grad_bias (V,)) for ``opts.reduction``
    "mean" or "sum".

    hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None. The loss is a 0-d
    tensor in the accumulation dtype (NaN for ``mean`` without counted tokens, as the
    recompute path); the gradients are those of the loss for an upstream gradient of 1, each
    in its input's dtype, None when not asked for.
    """
    n = hidden.shape[0]
    v = weight.shape[0]
    target, bias = _contiguous_vectors(target, bias)
    acc = accumulation_dtype(compute_dtype)
    counted, out_of_range = _token_masks(target, v, opts.ignore_index)
    count = counted.sum()
    upstream = _token_factors(counted, out_of_range, count, opts.reduction, acc)
    del out_of_range
    need_bias = need_bias and bias is not None
    row_chunks = plan.row_chunks(n)
    grads = _Gradients.allocate(hidden, weight, acc, several_row_chunks=len(row_chunks) > 1,
                                per_chunk=plan.per_chunk, need_hidden=need_hidden, need_weight=need_weight,
                                need_bias=need_bias)
    stats = RowStats.empty(n, hidden.device, acc)
    work = _Workspace(plan, hidden, weight, compute_dtype, acc, grads)
    any_grad = need_hidden or need_weight or need_bias
    z = h_i = None
    for i, (r0, r1) in enumerate(row_chunks):
        h_i = work.hidden_rows(r0, r1)
        z = work.logits(h_i)
        rows = stats.rows(r0, r1)
        block_math.chunk_stats(z, bias, 0, target[r0:r1], rows, softcap=opts.softcap_value,
                               need_sum=opts.label_smoothing > 0)
        if not any_grad:
            continue
        lse_i = rows.logsumexp()
        d = block_math.logit_grad(z, bias, 0, target[r0:r1], lse_i, upstream[r0:r1], vocab=v,
                                  label_smoothing=opts.label_smoothing, z_loss=opts.z_loss,
                                  softcap=opts.softcap_value, out_dtype=compute_dtype)
        del lse_i
        grads.add_rows(d, h_i, work, r0, r1, first_row_chunk=i == 0)
        del d  # the PyTorch path's d is a copy: free it before the next block's product
    # z (a view of the workspace's block) and h_i would keep the block alive while finish
    # rounds the fp32 grad_W sum into the weight dtype
    del work, upstream, z, h_i
    grads.finish(ran=bool(row_chunks), bias_dtype=None if bias is None else bias.dtype)
    lse = stats.logsumexp()
    per_token = _token_loss(stats, lse, target, v, opts)
    del stats, lse
    loss = per_token.sum()
    if opts.reduction == "mean":
        loss = loss / count.to(loss.dtype)
    return loss, grads.hidden, grads.weight, grads.bias


def _token_factors(counted: torch.Tensor, out_of_range: torch.Tensor, count: torch.Tensor, reduction: str,
                   acc: torch.dtype) -> torch.Tensor:
    """Each token's factor of its logit gradients, (N,) in ``acc``: 1/count (``mean``; all
    zero when no token counts) or 1 (``sum``) for counted tokens, 0 for ignored ones, NaN
    for out-of-range targets."""
    if reduction == "mean":
        factors = torch.where(counted, 1.0 / count.to(acc), 0.0)
    else:
        factors = counted.to(acc)
    return torch.where(out_of_range, math.nan, factors)


@dataclass
class _Gradients:
    """The outputs, allocated before the first block (in this order): ``weight`` (V, H) in
    weight's dtype, or ``weight_sum``, its (V, H) accumulation-dtype sum when a bf16/fp16
    weight's rows come in several chunks under the "fp32" policy (``weight`` is allocated
    after the loop then); ``hidden`` (N, H) in hidden's dtype; ``bias`` (V,) accumulation
    dtype, cast to bias's dtype by :meth:`finish`."""

    hidden: torch.Tensor | None
    weight: torch.Tensor | None
    weight_sum: torch.Tensor | None
    bias: torch.Tensor | None
    weight_dtype: torch.dtype

    @classmethod
    def allocate(cls, hidden: torch.Tensor, weight: torch.Tensor, acc: torch.dtype, *, several_row_chunks: bool,
                 per_chunk: bool, need_hidden: bool, need_weight: bool, need_bias: bool) -> "_Gradients":
        (n, h), v, device = hidden.shape, weight.shape[0], hidden.device
        grad_weight = weight_sum = None
        if need_weight and (weight.dtype == acc or not several_row_chunks or per_chunk):
            grad_weight = torch.empty(v, h, device=device, dtype=weight.dtype)
        elif need_weight:
            weight_sum = torch.empty(v, h, device=device, dtype=acc)
        grad_hidden = torch.empty(n, h, device=device, dtype=hidden.dtype) if need_hidden else None
        bias_sum = torch.zeros(v, device=device, dtype=acc) if need_bias else None
        return cls(hidden=grad_hidden, weight=grad_weight, weight_sum=weight_sum, bias=bias_sum,
                   weight_dtype=weight.dtype)

    def add_rows(self, d: torch.Tensor, h_i: torch.Tensor, work: "_Workspace", r0: int, r1: int, *,
                 first_row_chunk: bool) -> None:
        """One row chunk's share: bias += 1ᵀ d; hidden[r0:r1] = d @ W; weight (+)= dᵀ @ h_i.

        d (R, V), h_i (R, H) and the converted weight ``work.weight`` (V, H) are in the
        compute dtype."""
        if self.bias is not None:  # column sums as a (1, R) @ (R, V) product: no fp32 copy of the block
            matmul_into(self.bias.view(1, -1), work.ones[: d.shape[0]].view(1, -1), d, accumulate=True)
        if self.hidden is not None:
            work.store_hidden_rows(self.hidden[r0:r1], d)
        if self.weight_sum is not None:
            matmul_into(self.weight_sum, d.t(), h_i, accumulate=not first_row_chunk)
        elif self.weight is not None and self.weight.dtype == accumulation_dtype(d.dtype):
            matmul_into(self.weight, d.t(), h_i, accumulate=not first_row_chunk)  # an fp32 weight: in place
        elif self.weight is not None and first_row_chunk:
            _write_product(self.weight, d.t(), h_i)
        elif self.weight is not None:  # "per_chunk": each later row chunk rounded into the bf16/fp16 gradient
            matmul_into(self.weight, d.t(), h_i, accumulate=True)

    def finish(self, *, ran: bool, bias_dtype: torch.dtype | None) -> None:
        """Zero the weight gradient when no row was seen; round the fp32 sums into the
        inputs' dtypes (grad_weight allocated here, while its sum is still alive)."""
        if not ran:
            for g in (self.weight, self.weight_sum):
                if g is not None:
                    g.zero_()
        if self.weight_sum is not None:
            self.weight = self.weight_sum.to(self.weight_dtype)
            self.weight_sum = None
        if self.bias is not None:
            self.bias = self.bias.to(bias_dtype)


class _Workspace:
    """The buffers reused for every row chunk, allocated in this order: ``weight``, the whole
    weight in the compute dtype (a view, or one converted copy); ``block``, one (rows, V)
    block in the accumulation dtype, rows padded to :func:`block_row_stride`; the converted
    hidden rows (when hidden's dtype is not the compute dtype); ``partials`` (split_k, rows,
    H) accumulation-dtype split-K products and ``stage`` (rows, H) their sum when the
    gradient is narrower (split-K only); ``ones`` (rows,) compute dtype (bias only)."""

    def __init__(self, plan: ChunkPlan, hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype,
                 acc: torch.dtype, grads: _Gradients) -> None:
        (n, h), v, device = hidden.shape, weight.shape[0], hidden.device
        rows = min(plan.rows, n)
        self._h = h
        self.weight = weight if weight.dtype == compute_dtype else weight.to(compute_dtype)
        self.block = torch.empty(rows * block_row_stride(v, device), device=device, dtype=acc)
        self.hidden_rows = Converter(hidden, plan.rows, compute_dtype)
        self.partials = self.stage = None
        if grads.hidden is not None and plan.split_k > 1:
            self.partials = torch.empty(plan.split_k, rows, h, device=device, dtype=acc)
            if grads.hidden.dtype != acc:
                self.stage = torch.empty(rows * h, device=device, dtype=acc)
        self.ones = torch.ones(rows, device=device, dtype=compute_dtype) if grads.bias is not None else None

    def logits(self, h_i: torch.Tensor) -> torch.Tensor:
        """x = h_i @ Wᵀ for h_i (R, H): an (R, V) view of the block, unit column stride."""
        rows, v = h_i.shape[0], self.weight.shape[0]
        stride = block_row_stride(v, self.block.device)
        z = self.block[: rows * stride].view(rows, stride)[:, :v]
        matmul_into(z, h_i, self.weight.t(), accumulate=False)
        return z

    def store_hidden_rows(self, out: torch.Tensor, d: torch.Tensor) -> None:
        """out (R, H) = d @ W, rounded once to out's dtype (through ``stage`` after a split)."""
        if self.partials is None:
            matmul_into(out, d, self.weight, accumulate=False)
        elif self.stage is None:
            split_k_matmul_into(out, d, self.weight, self.partials)
        else:
            stage = self.stage[: out.numel()].view(out.shape)
            split_k_matmul_into(stage, d, self.weight, self.partials)
            out.copy_(stage)
