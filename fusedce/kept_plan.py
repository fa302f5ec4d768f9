"""Logits kept from the forward: what an explicit budget holds beyond a good block, spent on not recomputing.

A recompute plan computes every logit twice, in forward and again in backward: 8·N·H·V FLOPs.
Under an explicit budget (``"fast"``, bytes, a multiple of the floor) the planner used to widen
its block until the budget was spent; past a few thousand columns a wider block saves almost no
time (at 8192×4096×128256 in bf16 the ``"fast"`` block held 103936 columns, 2.6 × the floor, and
ran 49.8 ms against the default's 4736 columns at 56.2 ms on an H100,
``benchmarks/results/grad-weight-rounding-h100-2026-12-06/frontier-bf16/``). Spent instead on the logits of the
first K vocabulary columns, the same bytes save their backward product::

    forward   x[:, :K] = h @ W[:K]ᵀ  written by cuBLAS in bf16 (one rounding of each fp32 dot
              product) into an (N, K) tensor that autograd holds until the backward; their
              statistics are folded from it; the columns [K, V) as before
    backward  the blocks of [0, K) compute their gradients from the kept logits (no product);
              those of [K, V) recompute theirs
    FLOPs     (8 − 2·K/V)·N·H·V;  bytes held from the forward to the end of the backward: N·K·2

Bytes: grad_hidden's fp32 sum (R·H·4) + the default plan's block + N·K·2 ≤ the budget, K a
multiple of :data:`~fusedce.block_sizes.COL_ALIGN`; the default plan's block is the one the default
budget found fast, so every byte beyond it goes to K.

Precision: a kept logit is rounded to bf16 before its softmax, as in PyTorch's own bf16 loss and in
Liger-Kernel (their logits are bf16), where a recomputed one stays fp32. The measured errors are in
``benchmarks/NOTES.md``.

Only where: every tensor is bf16 (no conversion of hidden or weight; bf16 has fp32's exponent
range, where fp16 logits could overflow), on the Triton path with the tiled kernels (CUDA, a GPU with
tensor-memory copies), the strategy is ``"auto"`` (``"recompute"``
asked for by name keeps nothing across the forward), the chunk sizes are the planner's, the
backward runs in one pass, K holds at least one block of the default plan's columns, and H ≥
:data:`KEPT_MIN_HIDDEN`: at 8192×768×32777 on an H200 keeping 22272 columns took 6.26 ms against 3.61
without (``benchmarks/NOTES.md``, design 18): a small head's step is its launches, and a kept block
takes a product, a statistics kernel and a gradient kernel where the tiled kernels take one launch.
"""
from __future__ import annotations

import dataclasses

import torch

from fusedce.block_sizes import COL_ALIGN
from fusedce.planner import ChunkPlan

KEPT_BYTES = 2  # a kept logit in bf16
KEPT_MIN_HIDDEN = 2048  # below, the kept blocks' launches cost more than their products save (module docstring)


def keep_logits(plan: ChunkPlan, default: ChunkPlan, n: int, h: int, v: int, budget: int, *,
                hidden_dtype: torch.dtype, weight_dtype: torch.dtype, compute_dtype: torch.dtype,
                tiled: bool) -> ChunkPlan:
    """``default``'s blocks with kept logits (module docstring) where they fit ``budget`` bytes and
    the conditions hold, else ``plan`` (the explicit budget's own recompute plan), unchanged.
    ``tiled``: the call runs on the Triton path with the tiled kernels (a GPU with tensor-memory
    copies), where the kept logits were measured; the PyTorch path would widen each kept block into
    one more fp32 block, which the budget does not hold."""
    if not (tiled and hidden_dtype == weight_dtype == compute_dtype == torch.bfloat16) or plan.hidden_rows \
            or default.hidden_rows or default.strategy != "recompute" or h < KEPT_MIN_HIDDEN:
        return plan
    rows = min(default.rows, max(n, 1))
    block = default.block_elements(rows, v, torch.device("cuda")) * 4  # the accumulation dtype's bytes (fp32)
    left = budget - rows * h * 4 - block
    kept = min(v, left // (max(n, 1) * KEPT_BYTES)) // COL_ALIGN * COL_ALIGN
    if kept < min(default.cols, v):
        return plan
    return dataclasses.replace(default, kept_cols=kept)


def kept_columns(kept: torch.Tensor | None, weight: torch.Tensor, compute_dtype: torch.dtype) -> int:
    """K, the columns of the passes' kept logits (0 without ``kept``), after checking that they can
    be kept: an (N, K ≤ V) contiguous tensor of the compute dtype, for a weight already in it
    (``ValueError`` otherwise)."""
    if kept is None:
        return 0
    if weight.dtype != compute_dtype or kept.dtype != compute_dtype or not kept.is_contiguous() \
            or kept.dim() != 2 or kept.shape[1] > weight.shape[0]:
        raise ValueError("kept logits need a weight in the compute dtype and an (N, K <= V) contiguous tensor "
                         "of that dtype")
    return kept.shape[1]
