"""How many rows and vocabulary columns a block of the N×V logits takes (:mod:`fusedce.planner`'s sizing).

A block of ``rows`` tokens × ``cols`` vocabulary entries is the unit every plan walks: its rows size
the row-long buffers (grad_hidden's fp32 sum, a converted hidden chunk), its columns the block buffer and
a converted weight chunk. Rows come in multiples of :data:`ROW_ALIGN` and columns of :data:`COL_ALIGN`;
neither gets so small that a block's launches, not its GEMMs, set the time (:func:`narrowest_cols`).
"""
from __future__ import annotations

import torch

COL_ALIGN = 128
MIN_COLS = 1024  # the narrowest block up to MIN_BLOCK_LOGITS // MIN_COLS rows (narrowest_cols)
MIN_BLOCK_LOGITS = 16384 * MIN_COLS  # below this a block's GEMMs get thin and its launches dominate
MIN_ROWS = 1024
ROW_ALIGN = 64


def rows_within(n: int, per_row: int, budget: int, weight_dtype: torch.dtype, chunk_size: int | None,
                per_chunk: bool = False) -> int:
    """Tokens per row chunk (≥ 1): ``per_row`` bytes each, at most two thirds of ``budget``; several chunks
    are balanced, the bytes they leave go to the columns (at 8192×3072×32064 amp: 16 blocks, not 52; design 13)."""
    n_eff = max(n, 1)
    if chunk_size is not None:
        return min(n_eff, chunk_size)
    if weight_dtype != torch.float32 and not per_chunk:
        return n_eff  # an exact 2-byte grad_weight sums all N rows at once (fusedce.planner's docstring)
    share = budget * 2 // 3  # at most two thirds of the budget for row-sized buffers
    if n_eff * per_row <= share:
        return n_eff
    fits = max(MIN_ROWS, share // per_row)
    return max(balanced_rows(n_eff, fits, n_eff), min(MIN_ROWS, n_eff))


def narrowest_cols(rows: int, v: int) -> int:
    """The narrowest block of ``rows`` rows the planner makes (unless ``vocab_chunk_size`` asks for
    narrower): :data:`MIN_COLS` columns up to 16384 rows; beyond, as many logits as 16384 × 1024
    (:data:`MIN_BLOCK_LOGITS`), a multiple of 128 and never under one 256-column tile
    (:data:`fusedce.kernels.tiles.TILE_N`). A block's GEMMs and kernels take time in proportion to its
    logits and its host cost is per launch, so what keeps a block from being launch-bound is its
    logits, not its width: at 32768 tokens 512 columns hold the logits 1024 do at 16384."""
    by_logits = -(-MIN_BLOCK_LOGITS // max(rows, 1) // COL_ALIGN) * COL_ALIGN
    return min(v, MIN_COLS, max(2 * COL_ALIGN, by_logits))


def cols_within(v: int, rows: int, left: int, weight_row: int, vocab_chunk_size: int | None,
                logit_bytes: int = 4) -> int:
    """Vocabulary entries per chunk: a ``rows``-row block of ``logit_bytes`` a logit (and
    ``weight_row`` bytes of converted weight per entry) in the ``left`` bytes of the budget, a
    multiple of 128 and at least :func:`narrowest_cols` unless the whole vocabulary fits."""
    if vocab_chunk_size is not None:
        return min(v, vocab_chunk_size)
    cols = max(0, left) // (rows * logit_bytes + weight_row)
    if cols >= v:
        return v
    cols = max(narrowest_cols(rows, v), cols // COL_ALIGN * COL_ALIGN)
    return min(cols, v)


def balanced_rows(n: int, fits: int, limit: int) -> int:
    """Rows per chunk ≤ ``fits``: the fewest chunks of ``limit``-capped rows, balanced and
    rounded up to a multiple of 64 when that still fits (at least 1)."""
    if fits >= limit:
        return limit
    if fits < 1:
        return 1
    chunks = -(-max(n, 1) // fits)
    rows = -(-max(n, 1) // chunks)
    aligned = -(-rows // ROW_ALIGN) * ROW_ALIGN
    if aligned <= fits:
        return aligned
    return fits // ROW_ALIGN * ROW_ALIGN if fits >= ROW_ALIGN else fits
