"""Kernel: fold one block of logits into each token's running log-sum-exp statistics."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedce.kernels.activation import activate
from fusedce.kernels.running import fold_into_row
from fusedce.stats import RowStats


@triton.jit
def chunk_stats_kernel(
    z_ptr, z_row_stride, bias_ptr, target_ptr, col0, n_cols,
    max_ptr, sumexp_ptr, target_logit_ptr, logit_sum_ptr,
    softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_SUM: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per token row. z: (R, C) raw logits of columns [col0, col0 + C), fp32 or 2-byte
    (kept logits, :mod:`fusedce.kept_plan`), summed in fp32.

    Online log-sum-exp over the row: for each block, m' = max(m, max_b z),
    s' = s·exp(m − m') + Σ_b exp(z − m'); then the same merge with the running (m, s)
    stored for the row by earlier vocabulary chunks. Each row is owned by one program, so
    the result does not depend on scheduling (bitwise reproducible).
    """
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_row_stride
    local_target = tl.load(target_ptr + row) - col0

    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    z_target = tl.zeros((), tl.float32)
    z_sum = tl.zeros((), tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < n_cols
        x = tl.load(z_row + offs, mask=mask, other=0.0).to(tl.float32)
        x = activate(x, bias_ptr, offs, mask, softcap, HAS_BIAS, HAS_SOFTCAP)
        x = tl.where(mask, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        z_target += tl.sum(tl.where((offs == local_target) & mask, x, 0.0), axis=0)
        if NEED_SUM:
            z_sum += tl.sum(tl.where(mask, x, 0.0), axis=0)

    fold_into_row(max_ptr, sumexp_ptr, target_logit_ptr, logit_sum_ptr, row, m, s, z_target, z_sum, NEED_SUM)


def chunk_stats(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    col0: int,
    target: torch.Tensor,
    stats: RowStats,
    *,
    softcap: float,
    need_sum: bool,
) -> None:
    """:meth:`BlockMath.chunk_stats <fusedce.block_math.BlockMath.chunk_stats>` on an fp32, bf16 or
    fp16 ``z`` (left unchanged) and fp32 ``stats``."""
    rows, n_cols = z.shape
    if rows == 0:
        return
    assert z.dtype in (torch.float32, torch.bfloat16, torch.float16) and z.stride(1) == 1
    block = min(triton.next_power_of_2(n_cols), 2048)
    chunk_stats_kernel[(rows,)](
        z, z.stride(0), bias if bias is not None else z, target, col0, n_cols,
        stats.max, stats.sumexp, stats.target_logit, stats.logit_sum,
        float(softcap),
        HAS_BIAS=bias is not None, HAS_SOFTCAP=bool(softcap), NEED_SUM=need_sum,
        BLOCK_V=block, num_warps=8 if block >= 2048 else 4,
    )
