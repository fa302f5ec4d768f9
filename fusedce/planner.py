"""The memory budget, and how it becomes a strategy and a chunking of the N×V logits.

**The budget** (``memory_budget`` of the API) is bytes of temporaries — everything a step
holds besides its inputs, the gradients it returns (the *floor*, :func:`gradient_floor_bytes`)
and O(N) per-token vectors. :func:`budget_bytes` reads it as:

- ``None`` or ``"default"``: a tenth of the floor plus 96 MiB, less 40 bytes a token, at
  least 32 MiB (:func:`default_budget_bytes`): the step stays under 1.1 × floor + 128 MiB.
- ``"min"``: 5 % of the floor, less the per-token bytes and :data:`ALLOCATOR_SLACK_BYTES`: the step
  at ≤ 1.05 × floor where the smallest blocks (:mod:`fusedce.block_sizes`: 1024 rows × 1024 columns,
  or as many logits at more rows) allow it — and where the blocks are not so small that the step
  becomes host-bound: otherwise the block shape with the fewest bytes of temporaries among those
  whose modelled time (:mod:`fusedce.time_model`) is within ``MIN_PLANNED_TIME_FACTOR`` of the
  default plan's. At large heads 5 % of the floor already is; at H = 768, V ≈ 32k it is not (5 %
  left 264 blocks, ten times the default's step time).
- ``"fast"``: 7/8 of N·V·c bytes, c the compute dtype's size. torch.compile keeps the N×V
  logits in the compute dtype for its backward (its extra memory is N·V·c, measured); a
  point that spends all of that on speed and is still slower is dominated by it, so
  ``"fast"`` stays strictly below it. Where it recomputes at H ≥ 2048, all in bf16 with the tiled kernels,
  the bytes beyond the default plan's block keep logits from forward for backward (:mod:`fusedce.kept_plan`).
- a float ``f ≥ 1``: a peak of ``f × floor``; (f − 1)·floor less the per-token bytes and the allocator's slack.
- an int: bytes, as given.

**Two strategies** (``ChunkPlan.strategy``):

- ``"recompute"``: the forward keeps only per-token statistics; backward recomputes each
  ``rows × cols`` block of logits (8·N·H·V FLOPs). Any reduction, any number of backwards.
  Its backward temporaries (``c`` = bytes of the compute dtype)::

      grad_hidden accumulator   rows · H · 4        (fp32, summed over vocabulary chunks)
      hidden chunk, converted   rows · H · c        (only if hidden.dtype != compute dtype)
      logits / logit grads      rows · cols · 4     (the grads overwrite the logits in place;
                                                     rows · cols · 2 when tiled: no fp32 logits)
      weight chunk, converted   cols · H · c        (only if weight.dtype != compute dtype)

- ``"precompute"``: for a scalar loss (mean/sum) whose gradients are needed, the gradients
  are computed during the forward pass for an upstream gradient of 1 and scaled by the
  real one in backward (6·N·H·V FLOPs). Row chunks of ``rows`` tokens × the whole
  vocabulary (a logit's gradient needs its row's finished log-sum-exp)::

      weight, converted         V · H · c           (only if weight.dtype != compute dtype)
      grad_weight accumulator   V · H · 4           (bf16/fp16 weight, > 1 row chunk, "fp32" policy)
      logits / logit grads      rows · V' · 4       (V' = V padded to 64 on CUDA)
      hidden chunk, converted   rows · H · c        (only if hidden.dtype != compute dtype)
      split-K partials, stage   (S + 1) · rows · H · 4   (CUDA, when grad_hidden's output is small)

  ``"auto"`` takes it under an explicit budget (not the default one: that keeps the default
  plans and a plain loss's semantics — any number of backwards, nothing held across the
  forward; nor ``"min"``, whose gradients held from forward to backward would be more than a
  recompute block) when it fits with at least 1024 rows per chunk (fewer would re-read and
  re-write grad_weight, V·H·4 bytes, too often: below ~630 rows that traffic costs more
  than the 2·N·H·V it saves) — in practice at generous budgets such as ``"fast"`` — and H ≥ 2048:
  the FLOPs it saves grow with H, the cost of its whole-vocabulary fp32 rows does not (design 14). Asked
  for by name (``strategy="precompute"``), it gets at least that many rows (or all N, or
  ``chunk_size``) whatever the budget: the budget doubles until they fit, as a recompute
  block never gets narrower than :func:`~fusedce.block_sizes.narrowest_cols`. Not for
  fp16 compute (gradients pre-scaled by 1/N underflow fp16).

**grad_weight of a bf16/fp16 weight summed over row chunks** (``grad_weight_accumulation``):
``"fp32"`` (default, exact: one rounding of an fp32 sum) either takes all N rows in one
chunk (recompute: then grad_hidden's fp32 accumulator is N·H·4; where that one pass would
hold twice the default or ``"fast"`` budget, or more than ``"min"``'s or one in numbers, the backward runs
in two passes instead,
:mod:`fusedce.split_plan`)
or sums in a V·H·4 accumulator; ``"per_chunk"`` adds each row chunk's product into the bf16/fp16 gradient
itself (one rounding per row chunk, Liger-Kernel's policy; error: DESIGN.md), so row chunks
cost nothing extra. An fp32 weight's gradient is always summed in place, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce.block_sizes import cols_within, rows_within

MiB = 1 << 20
MIN_BUDGET = 32 * MiB
BASE_BUDGET = 96 * MiB
PER_TOKEN_BYTES = 40  # the per-token vectors a step holds (statistics, lse, loss, masks)
MAX_BUDGET_BYTES = 2 ** 62  # a larger budget (10**400 bytes, 1e308 × the floor) is taken as this: no limit
MIN_FLOOR_FRACTION = 0.05  # "min": temporaries of 5 % of the floor
# A budget as a share of the floor ("min", a float) is met as the CUDA caching allocator counts a peak: it hands out
# a cached block whole when splitting it would leave less than 1 MiB, so a peak can count up to 1 MiB beyond its
# tensors' bytes (one such block measured at the default's and "min"'s peaks: benchmarks/NOTES.md, design 23).
ALLOCATOR_SLACK_BYTES = MiB
PRECOMPUTE_MIN_ROWS = 1024
PRECOMPUTE_MIN_HIDDEN = 2048  # "auto" precomputes only from this H (module docstring)
ROW_PAD = 64  # elements: a CUDA block's rows are padded to this (see block_row_stride)
MAX_SPLIT_K = 16
FAST_SHARE = 7 / 8  # "fast": this share of the N×V compute-dtype logits torch.compile keeps
TILED_LOGIT_BYTES = 2  # a tiled block stores only its bf16/fp16 gradients
MIN_PLANNED_TIME_FACTOR = 1.2  # "min": modelled time ≤ this × the default's (goal: 1.5 × measured; time_model: ≤ 25 % low)

BUDGET_SETTINGS = ("min", "default", "fast")
STRATEGIES = ("auto", "recompute", "precompute")
GRAD_WEIGHT_ACCUMULATIONS = ("fp32", "per_chunk")

@dataclass(frozen=True)
class ChunkPlan:
    """A chunking of an (N, V) logits matrix: ``rows`` tokens × ``cols`` vocabulary entries.

    ``strategy``: "recompute" or "precompute" (``cols == V`` then). ``per_chunk``: a
    bf16/fp16 grad_weight is summed over row chunks in its own dtype. ``split_k``: slices
    of the grad_hidden product's K = V (precompute on CUDA; 1 = no split). ``tiled``
    (recompute): the tiled kernels run the blocks (:mod:`fusedce.kernels.tiles`), so a block
    buffer holds a block's gradients in the 2-byte compute dtype, never its fp32 logits:
    :attr:`block_logit_bytes` is 2, and the same bytes hold twice the columns.
    ``hidden_rows`` > 0 (recompute): the backward runs in two passes
    (:mod:`fusedce.split_plan`): grad_hidden over blocks of ``hidden_rows`` × ``hidden_cols``,
    then grad_weight and grad_bias over blocks of ``rows`` × ``cols``; 0: one pass.
    ``kept_cols`` (recompute): the forward keeps the bf16 logits of the vocabulary columns
    ``[0, kept_cols)`` for the backward, whose blocks there skip the product (:mod:`fusedce.kept_plan`);
    the column chunks break at ``kept_cols``.
    """

    rows: int
    cols: int
    strategy: str = "recompute"
    per_chunk: bool = False
    split_k: int = 1
    tiled: bool = False
    hidden_rows: int = 0
    hidden_cols: int = 0
    kept_cols: int = 0

    def hidden_pass(self) -> "ChunkPlan | None":
        """The plan of a split backward's grad_hidden pass (None when the backward is one pass)."""
        if not self.hidden_rows:
            return None
        return ChunkPlan(rows=self.hidden_rows, cols=self.hidden_cols, tiled=self.tiled)

    def weight_pass(self) -> "ChunkPlan":
        """The plan of the blocks that sum grad_weight and grad_bias (and, in one pass, grad_hidden)."""
        return ChunkPlan(rows=self.rows, cols=self.cols, per_chunk=self.per_chunk, tiled=self.tiled,
                         kept_cols=self.kept_cols)

    @property
    def block_logit_bytes(self) -> int:
        """Bytes of the block buffer per logit of a block: 2 when :attr:`tiled`, else 4 (the
        fp32 logits; a float64 computation's blocks are sized by its accumulation dtype)."""
        return TILED_LOGIT_BYTES if self.tiled else 4

    def block_elements(self, rows: int, v: int, device: torch.device) -> int:
        """Accumulation-dtype elements of the block buffer for ``rows`` rows of a ``v``-entry
        vocabulary: a (rows, cols) block, rows padded (:func:`block_row_stride`); a tiled plan's
        holds 2-byte gradients, half as many, but at least one padded column a row."""
        logits = rows * block_row_stride(min(self.cols, v), device)
        return max(-(-logits // 2), rows * block_row_stride(1, device)) if self.tiled else logits

    def row_chunks(self, n: int) -> list[tuple[int, int]]:
        return [(r, min(n, r + self.rows)) for r in range(0, n, self.rows)]

    def col_chunks(self, v: int, start: int = 0) -> list[tuple[int, int]]:
        """Chunks of at most ``cols`` columns over ``[start, v)``, none across ``kept_cols``."""
        kept = min(self.kept_cols, v)
        spans = [(start, kept), (kept, v)] if start < kept else [(start, v)]
        return [(c, min(end, c + self.cols)) for begin, end in spans for c in range(begin, end, self.cols)]


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def block_row_stride(cols: int, device: torch.device) -> int:
    """Elements per row of a logits block: on CUDA rounded up to a multiple of 64, so that
    the fp32 block and its bf16 view (twice the stride) give cuBLAS 16-byte-aligned leading
    dimensions even for a ragged last vocabulary chunk (V = 32777 leaves 1161 columns)."""
    return -(-cols // ROW_PAD) * ROW_PAD if device.type == "cuda" else cols


def gradient_floor_bytes(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype, *,
                         has_bias: bool = False) -> int:
    """Bytes of grad_hidden + grad_weight (+ grad_bias): what any implementation must hold at the end."""
    bias = v * dtype_bytes(weight_dtype) if has_bias else 0
    return n * h * dtype_bytes(hidden_dtype) + v * h * dtype_bytes(weight_dtype) + bias


def default_budget_bytes(floor_bytes: int, n: int = 0) -> int:
    """Default bytes for temporaries: a tenth of the gradient floor plus 96 MiB, less the
    per-token vectors (≈ 40 bytes a token), at least 32 MiB.

    This keeps the whole step under 1.1 × floor + 128 MiB, with ~32 MiB to spare for the
    allocator's rounding and small tensors.
    """
    return max(MIN_BUDGET, floor_bytes // 10 + BASE_BUDGET - PER_TOKEN_BYTES * n)


def budget_bytes(memory_budget: int | float | str | None, *, floor: int, n: int, v: int,
                 compute_dtype: torch.dtype) -> int:
    """The bytes of temporaries that ``memory_budget`` allows (see the module docstring)."""
    if memory_budget is None or memory_budget == "default":
        return default_budget_bytes(floor, n)
    if memory_budget == "min":
        return max(0, int(MIN_FLOOR_FRACTION * floor) - PER_TOKEN_BYTES * n - ALLOCATOR_SLACK_BYTES)
    if memory_budget == "fast":
        return max(default_budget_bytes(floor, n), int(FAST_SHARE * n * v * dtype_bytes(compute_dtype)))
    if isinstance(memory_budget, float):  # capped: 1e308 × a floor is no number of bytes
        return max(0, int(min((memory_budget - 1.0) * floor, MAX_BUDGET_BYTES)) - PER_TOKEN_BYTES * n
                   - ALLOCATOR_SLACK_BYTES)
    return min(memory_budget, MAX_BUDGET_BYTES)


def check_options(*, chunk_size=None, vocab_chunk_size=None, memory_budget=None, strategy="auto",
                  grad_weight_accumulation="fp32") -> None:
    """Raise ValueError/TypeError naming the first invalid planner option."""
    for name, value in (("chunk_size", chunk_size), ("vocab_chunk_size", vocab_chunk_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be None or a positive int, got {value!r}")
    _check_budget(memory_budget)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if grad_weight_accumulation not in GRAD_WEIGHT_ACCUMULATIONS:
        raise ValueError(f"grad_weight_accumulation must be one of {GRAD_WEIGHT_ACCUMULATIONS}, "
                         f"got {grad_weight_accumulation!r}")


def _check_budget(budget) -> None:
    if budget is None or (isinstance(budget, str) and budget in BUDGET_SETTINGS):
        return
    if isinstance(budget, float):
        if not budget >= 1.0 or budget != budget or budget == float("inf"):
            raise ValueError(f"memory_budget as a float is a multiple of the gradient floor, >= 1.0; got {budget!r}")
        return
    if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:
        return
    raise ValueError(f"memory_budget must be None, bytes (a positive int), a multiple of the gradient floor "
                     f"(a float >= 1.0) or one of {BUDGET_SETTINGS}; got {budget!r}")


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
    memory_budget: int | float | str | None = None,
    strategy: str = "auto",
    grad_weight_accumulation: str = "fp32",
    scalar_loss: bool = False,
    needs_grad: bool = False,
    has_bias: bool = False,
    cuda: bool = False,
    sm_count: int | None = None,
    tiled: bool = False,
) -> ChunkPlan:
    """Pick the strategy, ``rows`` and ``cols`` so the temporaries fit the budget.

    ``chunk_size`` / ``vocab_chunk_size``, when given, cap rows / cols directly. The budget is
    a target, not a hard limit: a chunk never gets narrower than
    :func:`~fusedce.block_sizes.narrowest_cols` vocabulary entries (1024 up to 16384 rows; unless V is
    smaller or ``vocab_chunk_size`` asks for it). ``strategy="auto"`` considers
    "precompute" only for a ``scalar_loss`` (mean/sum) that ``needs_grad``; ``cuda``: the
    block's rows are padded (:func:`block_row_stride`); ``sm_count``: the GPU's SM count
    when split-K products are available (None: never split); ``tiled``: the tiled kernels can
    run this call's blocks (:func:`fusedce.kernels.tiles_planned`; a recompute plan then sizes
    its blocks at :data:`TILED_LOGIT_BYTES` a logit).
    """
    check_options(chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget,
                  strategy=strategy, grad_weight_accumulation=grad_weight_accumulation)
    floor = gradient_floor_bytes(n, h, v, hidden_dtype, weight_dtype, has_bias=has_bias)
    budget = budget_bytes(memory_budget, floor=floor, n=n, v=v, compute_dtype=compute_dtype)
    per_chunk = grad_weight_accumulation == "per_chunk" and _low_precision(weight_dtype, compute_dtype)
    if strategy == "precompute":
        _check_precompute_allowed(compute_dtype, scalar_loss, vocab_chunk_size)
    explicit = memory_budget not in (None, "default", "min")  # "min" recomputes: precompute holds more
    # a budget in numbers is the caller's bytes, and "min" the fewest within its time cap: the backward
    # splits wherever one pass would exceed them ("min" keeps the split only within SPLIT_TIME_FACTOR)
    split_over = 1 if isinstance(memory_budget, (int, float)) or memory_budget == "min" \
        else split_plan.SPLIT_OVER_BUDGET

    def plan_for(budget: int, explicit: bool = explicit, split_over: int = split_over) -> ChunkPlan:
        return _plan_within(n, h, v, hidden_dtype, weight_dtype, compute_dtype, budget, chunk_size, vocab_chunk_size,
                            strategy, explicit, per_chunk, scalar_loss, needs_grad, cuda, sm_count, tiled, split_over)

    def default_plan() -> ChunkPlan:  # the default budget's plan, for the budgets planned from it
        return plan_for(default_budget_bytes(floor, n), explicit=False, split_over=split_plan.SPLIT_OVER_BUDGET)

    plan = plan_for(budget)
    if explicit and strategy == "auto" and needs_grad and plan.strategy == "recompute" and chunk_size is None \
            and vocab_chunk_size is None:
        plan = kept_plan.keep_logits(plan, default_plan(), n, h, v, budget, hidden_dtype=hidden_dtype,
                                     weight_dtype=weight_dtype, compute_dtype=compute_dtype, tiled=tiled)
    if memory_budget == "min" and strategy != "precompute" and chunk_size is None and vocab_chunk_size is None:
        plan = min_plan.within_time_of(default_plan(), n, h, v, plan,
                                       hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                                       compute_dtype=compute_dtype, per_chunk=per_chunk)
    return plan


def _plan_within(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                 compute_dtype: torch.dtype, budget: int, chunk_size: int | None, vocab_chunk_size: int | None,
                 strategy: str, explicit: bool, per_chunk: bool, scalar_loss: bool, needs_grad: bool, cuda: bool,
                 sm_count: int | None, tiled: bool, split_over: int) -> ChunkPlan:
    """The strategy and chunking for ``budget`` bytes of temporaries (see :func:`plan_chunks`); a
    bf16/fp16 weight's backward splits where one pass would hold ``split_over`` × the budget."""
    chosen = strategy == "auto" and explicit and needs_grad and h >= PRECOMPUTE_MIN_HIDDEN
    if (strategy == "precompute" or chosen) and scalar_loss and compute_dtype != torch.float16 \
            and vocab_chunk_size is None:
        plan = precompute_plan.plan_precompute(n, h, v, hidden_dtype, weight_dtype, compute_dtype, budget,
                                               chunk_size, per_chunk, cuda, sm_count)
        wanted = min(max(n, 1), chunk_size or max(n, 1), PRECOMPUTE_MIN_ROWS)
        if strategy == "precompute":
            grown = max(budget, 1)
            while plan.rows < wanted:  # asked for by name: the budget yields to the rows it needs
                grown *= 2
                plan = precompute_plan.plan_precompute(n, h, v, hidden_dtype, weight_dtype, compute_dtype, grown,
                                                       chunk_size, per_chunk, cuda, sm_count)
            return plan
        if plan.rows >= wanted:
            return plan
    return _plan_recompute(n, h, v, hidden_dtype, weight_dtype, compute_dtype, budget, chunk_size,
                           vocab_chunk_size, per_chunk, tiled, split_over)


def _low_precision(weight_dtype: torch.dtype, compute_dtype: torch.dtype) -> bool:
    """Whether a weight's gradient is narrower than the accumulation dtype (bf16/fp16)."""
    acc = torch.float64 if compute_dtype == torch.float64 else torch.float32
    return dtype_bytes(weight_dtype) < dtype_bytes(acc)


def _check_precompute_allowed(compute_dtype: torch.dtype, scalar_loss: bool, vocab_chunk_size: int | None) -> None:
    if not scalar_loss:
        raise ValueError("strategy='precompute' needs reduction='mean' or 'sum' (a scalar loss): the gradients "
                         "computed in forward are scaled by one upstream gradient; use strategy='recompute'")
    if compute_dtype == torch.float16:
        raise ValueError("strategy='precompute' does not compute in float16 (gradients pre-scaled by 1/N "
                         "underflow float16); use strategy='recompute' or 'auto'")
    if vocab_chunk_size is not None:
        raise ValueError("strategy='precompute' takes whole vocabulary rows: vocab_chunk_size does not apply")


def _plan_recompute(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                    compute_dtype: torch.dtype, budget: int, chunk_size: int | None, vocab_chunk_size: int | None,
                    per_chunk: bool, tiled: bool, split_over: int) -> ChunkPlan:
    c = dtype_bytes(compute_dtype)
    converted_row = h * c if hidden_dtype != compute_dtype else 0
    per_row = h * 4 + converted_row  # accumulator (+ converted row)
    rows = rows_within(n, per_row, budget, weight_dtype, chunk_size, per_chunk)
    weight_row = h * c if weight_dtype != compute_dtype else 0  # a converted weight row
    tiled = tiled and c == TILED_LOGIT_BYTES
    logit_bytes = TILED_LOGIT_BYTES if tiled else 4
    # only where the grad_hidden sum itself passes its share of the budget (a split cuts that sum, never
    # the N-row blocks of its weight pass), or where the caller's bytes are exceeded at all
    if chunk_size is None and _low_precision(weight_dtype, compute_dtype) \
            and (split_over == 1 or rows * per_row > budget * 2 // 3):
        split = split_plan.split_backward(n, v, per_row, converted_row, weight_row, budget, vocab_chunk_size,
                                          logit_bytes, split_over)
        if split is not None:
            return ChunkPlan(rows=rows, cols=split.cols, tiled=tiled, hidden_rows=split.hidden_rows,
                             hidden_cols=split.hidden_cols)
    cols = cols_within(v, rows, budget - rows * per_row, weight_row, vocab_chunk_size, logit_bytes)
    return ChunkPlan(rows=rows, cols=cols, per_chunk=per_chunk and rows < max(n, 1), tiled=tiled)


# The plans built on this module's sizing (each imports from it), imported once it is defined, so that
# a planner call imports nothing more (a profiler worker's job clock counts what its first call imports).
from fusedce import kept_plan, min_plan, precompute_plan, split_plan  # noqa: E402
