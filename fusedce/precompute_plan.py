"""The precompute strategy's plan: rows of the whole vocabulary, and split-K slices on CUDA.

Its buffers are :mod:`fusedce.planner`'s table ("precompute"); :func:`plan_precompute` fits them
to a budget, :func:`split_k_count` decides how many slices the grad_hidden product's K = V takes.
"""
from __future__ import annotations

import torch

from fusedce.block_sizes import balanced_rows
from fusedce.planner import MAX_SPLIT_K, ROW_PAD, ChunkPlan, _low_precision, dtype_bytes


def split_k_count(rows: int, h: int, v: int, sm_count: int | None) -> int:
    """Slices of K = V for precompute's grad_hidden = d @ W, an (R, V) @ (V, H) product.

    Its output has only ⌈R/128⌉·⌈H/128⌉ tiles (24 for 448 × 768): most of an H200's 132 SMs
    would idle; S slices as one batched GEMM into S fp32 partials, then summed, give S times as
    many. 1 without ``sm_count``, when the output fills the GPU twice, or when K is short.
    """
    if not sm_count:
        return 1
    tiles = -(-rows // 128) * -(-h // 128)
    return max(1, min(MAX_SPLIT_K, (2 * sm_count) // max(tiles, 1), v // 1024))


def plan_precompute(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                     compute_dtype: torch.dtype, budget: int, chunk_size: int | None, per_chunk: bool, cuda: bool,
                     sm_count: int | None) -> ChunkPlan:
    """The precompute plan whose buffers (module docstring) fit ``budget``: rows balanced
    over the chunks and a multiple of 64 where possible; rows may come out below 1024 (the
    caller decides) and are at least 1."""
    c = dtype_bytes(compute_dtype)
    acc = 8 if compute_dtype == torch.float64 else 4
    stride = -(-v // ROW_PAD) * ROW_PAD if cuda else v
    fixed = v * h * c if weight_dtype != compute_dtype else 0
    per_row = stride * acc + (h * c if hidden_dtype != compute_dtype else 0)
    limit = min(max(n, 1), chunk_size or max(n, 1))

    def fit(extra_fixed: int) -> tuple[int, int]:
        """(rows, splits) within the budget less ``fixed + extra_fixed``."""
        left = max(0, budget - fixed - extra_fixed)
        splits = 1
        rows = left // per_row
        for _ in range(3):  # the split count depends on the rows and the rows on the split's buffers
            want = split_k_count(min(max(rows, 1), limit), h, v, sm_count)
            cost = per_row + ((want + 1) * h * acc if want > 1 else 0)
            rows, splits = left // cost, want
        return balanced_rows(n, min(rows, limit), limit), splits

    rows, splits = fit(0)
    accumulate = _low_precision(weight_dtype, compute_dtype) and not per_chunk
    if rows < max(n, 1) and accumulate:
        rows, splits = fit(v * h * acc)  # a bf16/fp16 grad_weight summed over row chunks in fp32
    splits = min(splits, split_k_count(rows, h, v, sm_count))
    better = split_k_count(rows, h, v, sm_count)  # balancing may have shrunk the rows: a wider split may fit
    if better > splits and rows * (per_row + (better + 1) * h * acc) <= budget - fixed - (
            v * h * acc if accumulate and rows < max(n, 1) else 0):
        splits = better
    several = rows < max(n, 1)
    return ChunkPlan(rows=rows, cols=v, strategy="precompute", per_chunk=per_chunk and several, split_k=splits)
