"""The forward of a row chunk under autocast in wide chunks: the weight converted into the block
buffer, as many rows as it holds beside their tile partials, each chunk multiplied and reduced in
one tiled launch (:mod:`fusedce.passes` calls it; ``benchmarks/NOTES.md``, design 14)."""
from __future__ import annotations

import torch

from fusedce.block_math import BlockMath, TileMath
from fusedce.block_workspace import BlockWorkspace
from fusedce.stats import RowStats


def converting_tile_math(block_math: BlockMath, weight: torch.Tensor, compute_dtype: torch.dtype
                         ) -> TileMath | None:
    """The block math's tiled kernels for an autocast forward (a weight converted to a 2-byte
    compute dtype): :func:`stats_in_wide_chunks` converts the weight into the block buffer in
    chunks wider than the plan's blocks, and one launch multiplies and reduces each."""
    if weight.dtype == compute_dtype or compute_dtype not in (torch.bfloat16, torch.float16) \
            or not isinstance(block_math, TileMath):
        return None
    return block_math


def stats_in_wide_chunks(tiles: TileMath, work: BlockWorkspace, h_i: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, offset: int, target_i: torch.Tensor, stats_i: RowStats, *,
                         softcap: float, need_sum: bool, plan_cols: int) -> int:
    """Forward of one row chunk under autocast, in as few launches as the block buffer allows.

    The block buffer holds R × C fp32 logits in the block path; here it holds a chunk of weight
    rows converted to the compute dtype (C'·H·c bytes) and the chunk's tile partials
    (:meth:`TileMath.partial_bytes`), with C' ≥ C (at 8192×768×32777: the whole vocabulary against
    2432 columns), and the tiled kernels multiply and reduce each chunk without writing its
    logits. h_i (R, H) in the compute dtype; ``stats_i`` (R,) views, updated in place.

    Only where the chunks are at least twice the block path's columns (the plan's, or the half of
    them whose fp32 logits fit a tiled plan's buffer; or the whole vocabulary): a tiled launch costs
    the host more than a block's product and reduction (tensor descriptors, a merge launch), and at
    8192×3072×32064 with ``"min"`` chunks as wide as its blocks took 22.3 ms
    against 16.2 (``benchmarks/results/autocast-forward-h100-2026-12-05/``).

    Returns the first vocabulary column not folded into ``stats_i``: 0 where the chunks would not
    be wide enough or the kernels refuse the operands (the block path then takes the whole row
    chunk), V when every column is done.
    """
    rows, (v, h) = h_i.shape[0], weight.shape
    cols = work.weight_chunk_cols(rows, h, h_i.element_size(), tiles.partial_bytes)
    block_cols = min(plan_cols, work.block_bytes // max(1, rows * 4))  # the block path's fp32 logits a launch
    if cols < min(v, 2 * block_cols):
        return 0
    for c0 in range(0, v, cols):
        c1 = min(v, c0 + cols)
        w_j, scratch = work.weight_chunk_view(c1 - c0, h, h_i.dtype)
        if not tiles.tiles_supported(h_i, w_j):  # checked before converting: a GPU without tensor-memory copies
            return c0
        w_j.copy_(weight[c0:c1])
        bias_j = None if bias is None else bias[c0:c1]
        if not tiles.tile_stats(h_i, w_j, bias_j, offset + c0, target_i, stats_i, scratch, softcap=softcap,
                                need_sum=need_sum):
            return c0  # a kernel variant this GPU cannot compile: nothing written for [c0, c1)
    return v
