"""A backward in two passes, for a bf16/fp16 weight whose one-pass plan cannot fit its budget.

An exact grad_weight of a bf16/fp16 weight is one rounding of an fp32 sum over all N rows, so the
one-pass recompute plan takes all N rows in one chunk (:func:`fusedce.block_sizes.rows_within`), and
its grad_hidden accumulator is then N·H·4 bytes: 512 MiB at 32768 tokens × H = 4096, more than
the default budget and ten times ``"min"``'s. Summing grad_hidden over row chunks instead would
need a V·H·4 sum for grad_weight (2 GiB at V = 128256). Two passes over the blocks need neither:

    pass 1 (grad_hidden)           row chunks of ``hidden_rows``: for each, recompute its blocks
                                   over the whole vocabulary, grad_hidden[i] = Σ_j d_ij @ W_j
                                   in a hidden_rows·H·4 accumulator, rounded once
    pass 2 (grad_weight, bias)     all N rows: for each vocabulary chunk, recompute the block,
                                   grad_weight[j] = d_jᵀ @ h in one product, rounded once

Both gradients stay exact (one rounding of an fp32 sum). The price is one more recompute of the
logits: 2·N·H·V FLOPs, 10·N·H·V for the step instead of 8 (about 1.25 × the one-pass time at large
heads). The passes run one after the other, so the temporaries are the larger of the two passes'
(pass 1: its accumulator and block; pass 2: its block), each sized to the budget.

Used only where the one-pass plan's smallest blocks (its N·H·4 accumulator and an N-row block of
:func:`~fusedce.block_sizes.narrowest_cols` columns) hold at least :data:`SPLIT_OVER_BUDGET` × the budget:
where they fit, one pass fills the same budget and is faster, and where they exceed it by less, a
quarter more time would buy less than the budget's own size (at 16384×3584×152064 in bf16 the
default budget's one pass holds 1.2 × it: 256 MiB against 211, on a 1152 MiB floor). That rule is the
default and ``"fast"`` budgets'. A budget in numbers is the caller's and splits wherever one pass exceeds
it (Llama-3's head at 32768 tokens asked for 1.25 × the floor peaked at 1.458 × with one pass); so does
``"min"``, which keeps the split only within :data:`SPLIT_TIME_FACTOR` of the default plan's modelled
time (:func:`fusedce.min_plan.within_time_of`; at Gemma-2's head in bf16 one pass held 1.076 × the floor).
"""
from __future__ import annotations

from dataclasses import dataclass

from fusedce.block_sizes import MIN_ROWS, balanced_rows, cols_within, narrowest_cols


SPLIT_OVER_BUDGET = 2  # split only where one pass would hold at least this × the budget
# "min": a split plan's modelled time ≤ this × the default plan's: 10/8 of the FLOPs at large heads, and the
# goal's 1.5 × measured with the model's 10 % (it was within 2 % of three measured splits, design 20)
SPLIT_TIME_FACTOR = 1.35


@dataclass(frozen=True)
class SplitBlocks:
    """The two passes' block shapes: grad_hidden's ``hidden_rows`` × ``hidden_cols``; grad_weight's
    all N rows × ``cols`` (the forward walks the latter)."""

    hidden_rows: int
    hidden_cols: int
    cols: int


def split_backward(n: int, v: int, per_row: int, converted_row: int, weight_row: int, budget: int,
                   vocab_chunk_size: int | None, logit_bytes: int, over: int) -> SplitBlocks | None:
    """The split's blocks for ``budget`` bytes of temporaries, or None where one pass is kept
    (it holds less than ``over`` × the budget: :data:`SPLIT_OVER_BUDGET` for the default and ``"fast"``
    budgets, 1 for the caller's own bytes or multiple of the floor, which a split honours at any price in
    time, and for ``"min"``, which keeps a split only within its time cap).

    ``per_row``: bytes a row of a grad_hidden pass holds (its fp32 accumulator row and, when
    hidden is converted, ``converted_row``); ``weight_row``: bytes of a converted weight row (0
    without conversion); ``logit_bytes``: bytes of the block buffer a logit
    (:attr:`fusedce.planner.ChunkPlan.block_logit_bytes`). None also when the split's rows could
    not be fewer than N (then it would only add a pass).
    """
    n_eff = max(n, 1)
    narrowest = min(v, vocab_chunk_size or narrowest_cols(n_eff, v))
    one_pass = n_eff * per_row + narrowest * (n_eff * logit_bytes + weight_row)
    if one_pass <= over * budget:
        return None
    fits = max(min(MIN_ROWS, n_eff), (budget * 2 // 3) // max(per_row, 1))
    hidden_rows = balanced_rows(n_eff, fits, n_eff)
    if hidden_rows >= n_eff:
        return None
    hidden_cols = cols_within(v, hidden_rows, budget - hidden_rows * per_row, weight_row, vocab_chunk_size,
                             logit_bytes)
    cols = cols_within(v, n_eff, budget - n_eff * converted_row, weight_row, vocab_chunk_size, logit_bytes)
    return SplitBlocks(hidden_rows=hidden_rows, hidden_cols=hidden_cols, cols=cols)


def split_temporaries(plan_rows: int, plan_cols: int, hidden_rows: int, hidden_cols: int, per_row: int,
                      converted_row: int, weight_row: int, logit_bytes: int) -> int:
    """Bytes of a split plan's temporaries: the larger pass's (see the module docstring)."""
    hidden_pass = hidden_rows * per_row + hidden_cols * (hidden_rows * logit_bytes + weight_row)
    weight_pass = plan_rows * converted_row + plan_cols * (plan_rows * logit_bytes + weight_row)
    return max(hidden_pass, weight_pass)
