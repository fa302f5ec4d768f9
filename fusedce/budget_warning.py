"""A memory budget in numbers that no plan meets: one warning, naming the peak the chosen plan will reach.

A budget given as bytes or as a multiple of the gradient floor is the caller's number, but the planner
never makes a block narrower than :func:`~fusedce.block_sizes.narrowest_cols` vocabulary columns (unless
``vocab_chunk_size`` asks for it), and an exact bf16/fp16 grad_weight sums all N rows at once, so a small
budget can be out of reach: at 8192×768×32777 in bf16, ``memory_budget=1.25`` leaves 15.7 MiB of
temporaries and the smallest split plan holds 17 MiB (1.27 × the floor). The step then runs with the
smallest plan and peaks above what was asked; :func:`warn_if_unmet` says so, once per process for each
call's shapes and options (a training loop plans the same call every step), with the peak
:func:`fusedce.memory_model.plan_peak_bytes` predicts.

The named budgets (``"default"``, ``"min"``, ``"fast"``) promise a rule, not a number, and are not
checked; neither are calls with ``chunk_size`` / ``vocab_chunk_size`` (the caller chose the blocks), nor
calls that need no gradient (the model is of a training step).
"""
from __future__ import annotations

import functools
import warnings

import torch

from fusedce.block_sizes import narrowest_cols
from fusedce.planner import MAX_BUDGET_BYTES, PER_TOKEN_BYTES, ChunkPlan, MiB, _low_precision, gradient_floor_bytes

SLACK_FLOOR_FRACTION = 0.01  # a peak within 1 % of the floor above the asked one is met (block alignment)


class MemoryBudgetWarning(UserWarning):
    """``memory_budget`` (bytes or a multiple of the floor) is below what the smallest plan holds."""


def warn_if_unmet(memory_budget: int | float | str | None, plan: ChunkPlan, n: int, h: int, v: int, *,
                  hidden_dtype: torch.dtype, weight_dtype: torch.dtype, compute_dtype: torch.dtype,
                  has_bias: bool, impl: str) -> None:
    """Warn (:class:`MemoryBudgetWarning`) when ``plan``'s predicted training-step peak is above what a
    numeric ``memory_budget`` allows: a float ``f`` allows ``f`` × the gradient floor, bytes allow the
    floor + that many bytes of temporaries + the per-token vectors. Not while torch.compile traces
    the call (a warning there would break its graph)."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)) \
            or torch.compiler.is_compiling():
        return
    _warn_once(memory_budget, plan, n, h, v, hidden_dtype, weight_dtype, compute_dtype, has_bias, impl)


@functools.lru_cache(maxsize=256, typed=True)  # once per process and call (typed: 2 bytes are not 2.0 × the floor)
def _warn_once(memory_budget: int | float, plan: ChunkPlan, n: int, h: int, v: int, hidden_dtype: torch.dtype,
               weight_dtype: torch.dtype, compute_dtype: torch.dtype, has_bias: bool, impl: str) -> None:
    message = _unmet_message(memory_budget, plan, n, h, v, hidden_dtype, weight_dtype, compute_dtype, has_bias, impl)
    if message:  # the caller's line: this frame, warn_if_unmet's, linear_cross_entropy's, then the caller's
        warnings.warn(message, MemoryBudgetWarning, stacklevel=4)


def _unmet_message(memory_budget: int | float, plan: ChunkPlan, n: int, h: int, v: int, hidden_dtype: torch.dtype,
                   weight_dtype: torch.dtype, compute_dtype: torch.dtype, has_bias: bool, impl: str) -> str | None:
    from fusedce.memory_model import plan_peak_bytes  # it imports the loss's passes: loaded when needed

    floor = gradient_floor_bytes(n, h, v, hidden_dtype, weight_dtype, has_bias=has_bias)
    if isinstance(memory_budget, float):
        allowed = memory_budget * floor
    else:  # bytes past MAX_BUDGET_BYTES are no limit (and no float: 10**400 + 0.5 overflows)
        allowed = floor + min(memory_budget, MAX_BUDGET_BYTES) + PER_TOKEN_BYTES * max(n, 1)
    peak = plan_peak_bytes(n, h, v, plan, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                           compute_dtype=compute_dtype, has_bias=has_bias, impl=impl).step
    if floor <= 0 or peak <= allowed + SLACK_FLOOR_FRACTION * floor:
        return None
    weight = str(weight_dtype).removeprefix("torch.")
    if plan.strategy == "precompute":
        why = "strategy='precompute' takes at least 1024 rows of the whole vocabulary a chunk"
    else:
        why = (f"blocks of {plan.rows} rows are at least {narrowest_cols(plan.rows, v)} vocabulary columns wide "
               f"unless vocab_chunk_size asks for narrower ones, at more time"
               + (" (an exact 2-byte grad_weight also sums all N rows in one block)"
                  if _low_precision(weight_dtype, compute_dtype) else ""))
    return (f"memory_budget={memory_budget!r} cannot be met at N×H×V = {n}×{h}×{v} ({weight} weight): the "
            f"smallest plan is predicted to peak at {peak / floor:.3g} × the gradient floor of "
            f"{floor / MiB:.1f} MiB ({(peak - allowed) / MiB:.1f} MiB over); {why}")
