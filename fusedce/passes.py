"""The chunked forward and backward passes (shared by the PyTorch and Triton paths).

Notation: N tokens, H hidden size, V vocabulary; x = hidden @ weight.T (+ bias) the raw
logits, c = softcap(x) what the loss sees, lse = logsumexp(c). The matrix products run on
torch (cuBLAS/CPU BLAS) in the compute dtype with an fp32 result; the softmax math on each
``rows × cols`` block runs in a :class:`~fusedce.block_math.BlockMath` (Triton kernels or
plain PyTorch).

Forward (2·N·H·V FLOPs): for each block, x = h_i @ W_jᵀ, then fold it into the per-token
running statistics (max, Σexp, c_y, Σc). Only the statistics (N floats each) survive; the
per-token loss and lse are returned, and lse is saved for backward.

Backward (6·N·H·V FLOPs): for each block, recompute x, turn it in place into
d = g_n · ∂L_n/∂x (g the per-token upstream gradient), then
    grad_hidden[i]  += d @ W_j          (fp32 accumulator over vocabulary chunks)
    grad_weight[j]  += dᵀ @ h_i         (in the fp32 output, or written once)
    grad_bias[j]    += Σ_rows d
Nothing of size N×V is ever allocated: the largest temporary is one fp32 block.
"""
from __future__ import annotations

import math

import torch

from fusedce.block_math import BlockMath
from fusedce.matmul import matmul_into
from fusedce.options import LossOptions
from fusedce.planner import ChunkPlan
from fusedce.stats import RowStats


def accumulation_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if compute_dtype == torch.float64 else torch.float32


def block_row_stride(cols: int, device: torch.device) -> int:
    """Elements per row of a logits block: on CUDA rounded up to a multiple of 64, so that
    the fp32 block and its bf16 view (twice the stride) give cuBLAS 16-byte-aligned leading
    dimensions even for a ragged last vocabulary chunk (V = 32777 leaves 1161 columns)."""
    return -(-cols // 64) * 64 if device.type == "cuda" else cols


def _block_buffer(plan: ChunkPlan, n: int, v: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(min(plan.rows, n) * block_row_stride(min(plan.cols, v), device), device=device, dtype=dtype)


def _block(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A (rows, cols) view of ``buffer`` with unit column stride and a padded row stride."""
    stride = block_row_stride(cols, buffer.device)
    return buffer[: rows * stride].view(rows, stride)[:, :cols]


def forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    opts: LossOptions,
    compute_dtype: torch.dtype,
    plan: ChunkPlan,
    block_math: BlockMath,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and logsumexp, both (N,) in the accumulation dtype.

    hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None. Ignored tokens get
    loss 0; tokens whose target is out of range (and not ignored) get NaN.
    """
    n, _ = hidden.shape
    v = weight.shape[0]
    target, bias = _contiguous_vectors(target, bias)
    acc = accumulation_dtype(compute_dtype)
    stats = RowStats.empty(n, hidden.device, acc)
    buffer = _block_buffer(plan, n, v, hidden.device, acc)
    hidden_rows = _Converter(hidden, plan.rows, compute_dtype)
    weight_rows = _Converter(weight, plan.cols, compute_dtype)
    for r0, r1 in plan.row_chunks(n):
        h_i = hidden_rows(r0, r1)
        for c0, c1 in plan.col_chunks(v):
            w_j = weight_rows(c0, c1)
            z = _block(buffer, r1 - r0, c1 - c0)
            matmul_into(z, h_i, w_j.t(), accumulate=False)
            block_math.chunk_stats(z, None if bias is None else bias[c0:c1], c0, target[r0:r1], stats.rows(r0, r1),
                            softcap=opts.softcap_value, need_sum=opts.label_smoothing > 0)
    lse = stats.logsumexp()
    eps = opts.label_smoothing
    loss = (1.0 - eps) * (lse - stats.target_logit)
    if eps:
        loss = loss + eps * (lse - stats.logit_sum / v)
    if opts.z_loss:
        loss = loss + opts.z_loss * lse * lse
    loss = torch.where(target == opts.ignore_index, 0.0, loss)
    bad = ((target < 0) | (target >= v)) & (target != opts.ignore_index)
    loss = torch.where(bad, math.nan, loss)
    return loss, lse


def backward(
    grad_loss: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    lse: torch.Tensor,
    opts: LossOptions,
    compute_dtype: torch.dtype,
    plan: ChunkPlan,
    block_math: BlockMath,
    *,
    need_hidden: bool = True,
    need_weight: bool = True,
    need_bias: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients (grad_hidden (N, H), grad_weight (V, H), grad_bias (V,)) in each input's dtype.

    ``grad_loss`` (N,) is the upstream gradient of each token's loss (mean/sum/none all reduce
    to this). For an fp16 compute dtype, the logit gradients are computed as d·2⁻ᵏ with
    2ᵏ ≥ max|grad_loss| so that small upstream gradients (1/N for ``mean``) do not underflow
    fp16; the power of two is multiplied back, exactly, in fp32.
    """
    n, h = hidden.shape
    v = weight.shape[0]
    target, bias = _contiguous_vectors(target, bias)
    device = hidden.device
    acc = accumulation_dtype(compute_dtype)
    valid = target != opts.ignore_index
    bad = ((target < 0) | (target >= v)) & valid
    row_scale = torch.where(valid, grad_loss.to(acc), 0.0)
    row_scale = torch.where(bad, math.nan, row_scale)
    scale = None
    if compute_dtype == torch.float16 and n:
        peak = row_scale.abs().amax()
        scale = torch.where(peak > 0, torch.exp2(torch.ceil(torch.log2(peak))), 1.0)
        row_scale = row_scale / scale

    need_bias = need_bias and bias is not None
    row_chunks = plan.row_chunks(n)
    # grad_weight: summed in place when it is fp32; written once per vocabulary chunk when all
    # rows are one chunk; otherwise summed in an fp32 copy (only when chunk_size forces it).
    if weight.dtype == acc or len(row_chunks) <= 1:
        grad_weight = torch.zeros(v, h, device=device, dtype=weight.dtype) if need_weight else None
        weight_acc = grad_weight if weight.dtype == acc else None
    else:
        grad_weight = None
        weight_acc = torch.zeros(v, h, device=device, dtype=acc) if need_weight else None
    grad_hidden = torch.empty(n, h, device=device, dtype=hidden.dtype) if need_hidden else None
    grad_bias = torch.zeros(v, device=device, dtype=acc) if need_bias else None

    buffer = _block_buffer(plan, n, v, device, acc)
    hidden_acc = torch.empty(min(plan.rows, n) * h, device=device, dtype=acc) if need_hidden else None
    hidden_rows = _Converter(hidden, plan.rows, compute_dtype)
    weight_rows = _Converter(weight, plan.cols, compute_dtype)
    ones = torch.ones(min(plan.rows, n), device=device, dtype=compute_dtype) if need_bias else None
    for r0, r1 in row_chunks:
        h_i = hidden_rows(r0, r1)
        gh = hidden_acc[: (r1 - r0) * h].view(r1 - r0, h) if need_hidden else None
        for k, (c0, c1) in enumerate(plan.col_chunks(v)):
            w_j = weight_rows(c0, c1)
            z = _block(buffer, r1 - r0, c1 - c0)
            matmul_into(z, h_i, w_j.t(), accumulate=False)
            d = block_math.logit_grad(z, None if bias is None else bias[c0:c1], c0, target[r0:r1], lse[r0:r1],
                               row_scale[r0:r1], vocab=v, label_smoothing=opts.label_smoothing,
                               z_loss=opts.z_loss, softcap=opts.softcap_value, out_dtype=compute_dtype)
            if need_bias:  # column sums as a (1, R) @ (R, C) product: no fp32 copy of the block
                matmul_into(grad_bias[c0:c1].view(1, -1), ones[: r1 - r0].view(1, -1), d, accumulate=True)
            if need_hidden:
                matmul_into(gh, d, w_j, accumulate=k > 0)
            if need_weight:
                if weight_acc is not None:
                    matmul_into(weight_acc[c0:c1], d.t(), h_i, accumulate=True)
                else:
                    _write_product(grad_weight[c0:c1], d.t(), h_i)
            del d  # the PyTorch path's d is a copy: free it before the next block's product
        if need_hidden:
            if scale is not None:
                gh.mul_(scale)
            grad_hidden[r0:r1] = gh
    if need_weight:
        if scale is not None and weight_acc is not None:
            weight_acc.mul_(scale)
        elif scale is not None:
            grad_weight.mul_(scale.to(grad_weight.dtype))
        if grad_weight is None:
            grad_weight = weight_acc.to(weight.dtype)
    if need_bias:
        if scale is not None:
            grad_bias.mul_(scale)
        grad_bias = grad_bias.to(bias.dtype)
    return grad_hidden, grad_weight, grad_bias


class _Converter:
    """Rows ``[r0, r1)`` of a (M, K) matrix in the compute dtype.

    A view when the dtype already matches; otherwise a copy into one buffer of
    ``max_rows × K`` reused for every chunk, so two converted chunks never coexist.
    """

    def __init__(self, matrix: torch.Tensor, max_rows: int, dtype: torch.dtype) -> None:
        self.matrix, self.dtype = matrix, dtype
        self.buffer = None
        if matrix.dtype != dtype:
            rows = min(max_rows, matrix.shape[0])
            self.buffer = torch.empty(rows * matrix.shape[1], device=matrix.device, dtype=dtype)

    def __call__(self, r0: int, r1: int) -> torch.Tensor:
        if self.buffer is None:
            return self.matrix[r0:r1]
        out = self.buffer[: (r1 - r0) * self.matrix.shape[1]].view(r1 - r0, self.matrix.shape[1])
        return out.copy_(self.matrix[r0:r1])


def _contiguous_vectors(target: torch.Tensor, bias: torch.Tensor | None):
    """The kernels index target and bias with unit stride (copies only strided inputs, O(N + V))."""
    return target.contiguous(), (None if bias is None else bias.contiguous())


def _write_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out = a @ b, rounded once to out's dtype (fp32 accumulation inside the GEMM)."""
    if out.dtype == a.dtype:
        matmul_into(out, a, b, accumulate=False)
    else:
        tmp = torch.empty(out.shape, device=out.device, dtype=accumulation_dtype(a.dtype))
        matmul_into(tmp, a, b, accumulate=False)
        out.copy_(tmp)
