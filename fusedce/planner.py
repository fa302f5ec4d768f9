"""How the N×V logits are cut into chunks that fit a memory budget.

Both implementations (PyTorch and Triton) walk the same two-level loop: row chunks of
``rows`` tokens, and inside each, vocabulary chunks of ``cols`` entries. Only one
``rows × cols`` block of fp32 logits exists at a time.

Temporaries of the backward pass for one block (bytes; ``c`` = bytes per element of the
compute dtype, 2 for bf16/fp16):

    grad_hidden accumulator   rows · H · 4        (fp32, summed over vocabulary chunks)
    hidden chunk, converted   rows · H · c        (only if hidden.dtype != compute dtype)
    logits / logit grads      rows · cols · 4     (the grads overwrite the logits in place)
    weight chunk, converted   cols · H · c        (only if weight.dtype != compute dtype)

grad_weight is summed over row chunks. When the weight is fp32 (mixed precision), that sum
happens in the fp32 ``grad_weight`` output itself, at no extra cost. When it is bf16/fp16,
a sum over several row chunks would need an fp32 copy of grad_weight (V·H·4 bytes), so the
planner takes all N rows in one chunk instead and pays ``N·H·4`` for the grad_hidden
accumulator — unless ``chunk_size`` forces smaller row chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MiB = 1 << 20
MIN_BUDGET = 32 * MiB
BASE_BUDGET = 96 * MiB
COL_ALIGN = 128
MIN_COLS = 1024  # below this the GEMMs get thin and launches dominate
MIN_ROWS = 1024


@dataclass(frozen=True)
class ChunkPlan:
    """A chunking of an (N, V) logits matrix: ``rows`` tokens × ``cols`` vocabulary entries."""

    rows: int
    cols: int

    def row_chunks(self, n: int) -> list[tuple[int, int]]:
        return [(r, min(n, r + self.rows)) for r in range(0, n, self.rows)]

    def col_chunks(self, v: int) -> list[tuple[int, int]]:
        return [(c, min(v, c + self.cols)) for c in range(0, v, self.cols)]


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def gradient_floor_bytes(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype, *,
                         has_bias: bool = False) -> int:
    """Bytes of grad_hidden + grad_weight (+ grad_bias): what any implementation must hold at the end."""
    bias = v * dtype_bytes(weight_dtype) if has_bias else 0
    return n * h * dtype_bytes(hidden_dtype) + v * h * dtype_bytes(weight_dtype) + bias


def default_budget_bytes(floor_bytes: int, n: int = 0) -> int:
    """Default bytes for temporaries: a tenth of the gradient floor plus 96 MiB, less the
    per-token vectors (≈ 40 bytes a token), at least 32 MiB.

    This keeps the whole step under the memory goal of 1.1 × floor + 128 MiB, with ~32 MiB
    to spare for the allocator's rounding and small tensors.
    """
    return max(MIN_BUDGET, floor_bytes // 10 + BASE_BUDGET - 40 * n)


def plan_chunks(
    n: int,
    h: int,
    v: int,
    *,
    hidden_dtype: torch.dtype,
    weight_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    memory_budget: int | None = None,
) -> ChunkPlan:
    """Pick ``rows`` and ``cols`` so the backward temporaries fit ``memory_budget`` bytes.

    ``chunk_size`` / ``vocab_chunk_size``, when given, cap rows / cols directly. The budget is
    a target, not a hard limit: a chunk never gets narrower than 1024 vocabulary entries
    (unless V is smaller or ``vocab_chunk_size`` asks for it).
    """
    _check_sizes(chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget)
    c = dtype_bytes(compute_dtype)
    per_row = h * (4 + (c if hidden_dtype != compute_dtype else 0))  # accumulator (+ converted row)
    floor = gradient_floor_bytes(n, h, v, hidden_dtype, weight_dtype)
    budget = memory_budget if memory_budget is not None else default_budget_bytes(floor, n)
    rows = _plan_rows(n, per_row, budget, weight_dtype, chunk_size)
    weight_row = h * c if weight_dtype != compute_dtype else 0  # a converted weight row
    cols = _plan_cols(v, rows, budget - rows * per_row, weight_row, vocab_chunk_size)
    return ChunkPlan(rows=rows, cols=cols)


def _check_sizes(**sizes: int | None) -> None:
    for name, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be None or a positive int, got {value!r}")


def _plan_rows(n: int, per_row: int, budget: int, weight_dtype: torch.dtype, chunk_size: int | None) -> int:
    """Tokens per row chunk (≥ 1): ``per_row`` bytes each, at most two thirds of ``budget``."""
    n_eff = max(n, 1)
    if chunk_size is not None:
        return min(n_eff, chunk_size)
    if weight_dtype != torch.float32:
        return n_eff  # see the module docstring: avoids an fp32 copy of grad_weight
    share = budget * 2 // 3  # at most two thirds of the budget for row-sized buffers
    rows = n_eff if n_eff * per_row <= share else max(MIN_ROWS, share // per_row)
    return min(rows, n_eff)


def _plan_cols(v: int, rows: int, left: int, weight_row: int, vocab_chunk_size: int | None) -> int:
    """Vocabulary entries per chunk: a ``rows``-row fp32 block (and ``weight_row`` bytes of
    converted weight per entry) in the ``left`` bytes of the budget, a multiple of 128 and at
    least 1024 unless the whole vocabulary fits."""
    if vocab_chunk_size is not None:
        return min(v, vocab_chunk_size)
    cols = max(0, left) // (rows * 4 + weight_row)
    if cols >= v:
        return v
    cols = max(MIN_COLS, cols // COL_ALIGN * COL_ALIGN)
    return min(cols, v)
