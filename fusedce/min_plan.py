"""The ``"min"`` budget's plan where 5 % of the floor would make the step host-bound.

:func:`fusedce.planner.plan_chunks` plans ``"min"`` from 5 % of the gradient floor; where that
plan's modelled time (:mod:`fusedce.time_model`) exceeds
:data:`~fusedce.planner.MIN_PLANNED_TIME_FACTOR` × the default plan's, :func:`within_time_of`
picks the recompute block shape with the fewest bytes of temporaries within that time.
"""
from __future__ import annotations

import functools

import torch

from fusedce.block_sizes import COL_ALIGN, MIN_ROWS, ROW_ALIGN, narrowest_cols
from fusedce.planner import MIN_PLANNED_TIME_FACTOR, ChunkPlan, _low_precision, dtype_bytes
from fusedce import split_plan  # a module: it imports the planner, which imports this one
from fusedce.time_model import step_seconds


@functools.lru_cache(maxsize=256)  # a training loop plans the same shapes every step
def within_time_of(default: ChunkPlan, n: int, h: int, v: int, plan: ChunkPlan, *, hidden_dtype: torch.dtype,
                   weight_dtype: torch.dtype, compute_dtype: torch.dtype, per_chunk: bool) -> ChunkPlan:
    """``plan`` (the 5 %-of-the-floor plan) if its modelled time (:mod:`fusedce.time_model`)
    is within :data:`MIN_PLANNED_TIME_FACTOR` of the ``default`` plan's (a split backward's, within
    :data:`~fusedce.split_plan.SPLIT_TIME_FACTOR`: its extra pass is GEMM work), else the recompute
    block shape with the fewest bytes of temporaries (:func:`_recompute_bytes`) among those
    within that time (the default plan's own shape at worst).

    "min" trades time for memory, but not without bound: where the floor is small (H = 768,
    V ≈ 32k) 5 % of it leaves blocks so small that the host's per-block cost, not the GPU,
    sets the time (264 blocks ran 10 × the default's 14). There a step's time is about its
    number of blocks, so the shapes compared are those of a balanced split: ⌈N/i⌉ rows
    (multiples of 64, at least 1024; all N unless row chunks are free: an fp32 weight, or
    ``per_chunk``) by ⌈V/j⌉ columns (multiples of 128, at least 1024). For a given block
    count, a block's rows also size the fp32 grad_hidden sum (R·H·4) and its columns the
    converted weight chunk (C·H·c): at 8192×768×32777 in amp, 16 blocks of 2048 × 8320 hold
    1.77 × the floor where the default's shape, widened to 17 blocks of 8192 × 2048, held 1.84 ×."""
    convert_weight, c = weight_dtype != compute_dtype, dtype_bytes(compute_dtype)

    def seconds(candidate: ChunkPlan) -> float:
        return step_seconds(n, h, v, candidate, convert_weight=convert_weight, compute_bytes=c)

    limit = MIN_PLANNED_TIME_FACTOR * seconds(default)
    if seconds(plan) <= (split_plan.SPLIT_TIME_FACTOR * seconds(default) if plan.hidden_rows else limit):
        return plan
    n_eff = max(n, 1)
    row_options = [n_eff]
    if not _low_precision(weight_dtype, compute_dtype) or per_chunk:  # row chunks add no V·H·4 gradient sum
        row_options += sorted({_ceil_to(-(-n_eff // chunks), ROW_ALIGN) for chunks in range(2, n_eff // MIN_ROWS + 1)}
                              - {n_eff}, reverse=True)
        row_options = [rows for rows in row_options if rows >= min(MIN_ROWS, n_eff)]

    def col_options(rows: int) -> list[int]:
        narrowest = narrowest_cols(rows, v)
        return sorted({min(v, max(narrowest, _ceil_to(-(-v // chunks), COL_ALIGN)))
                       for chunks in range(1, max(1, v // narrowest) + 1)})

    def temporaries(candidate: ChunkPlan) -> int:
        return _recompute_bytes(n, h, v, candidate, hidden_dtype, weight_dtype, compute_dtype)

    best = default
    for rows in row_options:
        for cols in col_options(rows):  # narrowest first: the first one within the time is this row count's least
            candidate = ChunkPlan(rows=rows, cols=cols, per_chunk=per_chunk and rows < n_eff, tiled=plan.tiled)
            if seconds(candidate) <= limit:
                if (temporaries(candidate), seconds(candidate)) < (temporaries(best), seconds(best)):
                    best = candidate
                break
    return best


def _recompute_bytes(n: int, h: int, v: int, plan: ChunkPlan, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                     compute_dtype: torch.dtype) -> int:
    """Bytes of a recompute plan's temporaries (:mod:`fusedce.planner`'s table): the fp32
    grad_hidden sum and converted hidden chunk per row, the fp32 block and converted weight
    chunk per column (the block :attr:`~fusedce.planner.ChunkPlan.block_logit_bytes` a logit), and a
    bf16/fp16 weight's V·H·4 gradient sum when its rows come in several chunks without ``per_chunk``;
    a split backward's, its larger pass's (:func:`fusedce.split_plan.split_temporaries`)."""
    c = dtype_bytes(compute_dtype)
    rows, cols = min(plan.rows, max(n, 1)), min(plan.cols, v)
    converted_row = h * c if hidden_dtype != compute_dtype else 0
    per_row = h * 4 + converted_row
    weight_row = h * c if weight_dtype != compute_dtype else 0
    if plan.hidden_rows:
        return split_plan.split_temporaries(rows, cols, plan.hidden_rows, min(plan.hidden_cols, v), per_row,
                                            converted_row, weight_row, plan.block_logit_bytes)
    weight_sum = v * h * 4 if _low_precision(weight_dtype, compute_dtype) and rows < max(n, 1) \
        and not plan.per_chunk else 0
    return rows * per_row + cols * (rows * plan.block_logit_bytes + weight_row) + weight_sum


def _ceil_to(value: int, step: int) -> int:
    """``value`` rounded up to a multiple of ``step``."""
    return -(-value // step) * step
