"""Analytic peak memory of one fusedce forward+backward, for the profiler's predicted column.

Counts the tensors :mod:`fusedce.passes` (recompute) and :mod:`fusedce.precompute` allocate
(see their docstrings and DESIGN.md), in bytes, as "extra over the baseline where the inputs
already exist", for the plan :func:`fusedce.planner.plan_chunks` makes from the same
arguments (a training step: every gradient needed). The prediction is for the Triton path on
CUDA (cuBLAS writes fp32 results directly, the logit gradients overwrite the logits block in
place); the PyTorch path creates a few more block-sized temporaries, counted when
``impl="torch"`` (which is modelled as running on the CPU: no fp32-output products, no
padded rows, no split-K). Not modelled: the caching allocator's 512-byte rounding on CUDA,
and the CPU BLAS's own scratch buffers (oneDNN reorders a transposed bf16 operand into a
buffer of its own; it only sets the peak when the logits block is smaller than it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce.block_math_torch import SCALE_SLICE_BYTES
from fusedce.matmul import add_slice_rows
from fusedce.passes import accumulation_dtype, block_row_stride
from fusedce.planner import ChunkPlan, dtype_bytes, gradient_floor_bytes, plan_chunks


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes: peak extra during forward, during backward (gradients included), and the plan."""

    forward: int
    backward: int
    plan: ChunkPlan

    @property
    def step(self) -> int:
        return max(self.forward, self.backward)


def predict_peak_bytes(
    n: int,
    h: int,
    v: int,
    *,
    hidden_dtype: torch.dtype,
    weight_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    has_bias: bool = False,
    bias_dtype: torch.dtype | None = None,
    impl: str = "triton",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    memory_budget: int | float | str | None = None,
    strategy: str = "auto",
    grad_weight_accumulation: str = "fp32",
    reduction: str = "mean",
    sm_count: int | None = None,
    tiled: bool | None = None,
) -> MemoryPrediction:
    """Predicted peak extra bytes of ``linear_cross_entropy`` forward and backward, for a
    call whose gradients are all needed (a training step) with these planner arguments.

    ``sm_count``: the GPU's SM count for the split-K choice of the precompute strategy on
    CUDA (``impl="triton"``); None: the current CUDA device's when there is one, else no split.
    ``tiled``: whether the tiled kernels run the blocks (:func:`fusedce.kernels.tiles_planned`);
    None: as they would on the current CUDA device for contiguous inputs of these dtypes.
    """
    cuda = impl == "triton"
    if sm_count is None and cuda:
        sm_count = _current_sm_count(compute_dtype)
    if tiled is None:
        tiled = cuda and _current_tiled(h, hidden_dtype, weight_dtype, compute_dtype)
    plan = plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                       chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget,
                       strategy=strategy, grad_weight_accumulation=grad_weight_accumulation,
                       scalar_loss=reduction != "none", needs_grad=True, cuda=cuda, sm_count=sm_count if cuda else None,
                       tiled=tiled)
    return plan_peak_bytes(n, h, v, plan, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                           compute_dtype=compute_dtype, has_bias=has_bias, bias_dtype=bias_dtype, impl=impl)


def plan_peak_bytes(n: int, h: int, v: int, plan: ChunkPlan, *, hidden_dtype: torch.dtype,
                    weight_dtype: torch.dtype, compute_dtype: torch.dtype, has_bias: bool = False,
                    bias_dtype: torch.dtype | None = None, impl: str = "triton") -> MemoryPrediction:
    """:func:`predict_peak_bytes` for a ``plan`` already made (a training step: every gradient needed)."""
    if plan.strategy == "precompute":
        return _precompute_peaks(n, h, v, plan, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                                 compute_dtype=compute_dtype, has_bias=has_bias, bias_dtype=bias_dtype, impl=impl)
    return _predict(n, h, v, plan, hidden_dtype, weight_dtype, compute_dtype, has_bias, bias_dtype, impl)


def predict_vocab_parallel_peak_bytes(
    n: int,
    h: int,
    vocab_size: int,
    world_size: int,
    *,
    rank: int = 0,
    hidden_dtype: torch.dtype,
    weight_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    has_bias: bool = False,
    bias_dtype: torch.dtype | None = None,
    label_smoothing: float = 0.0,
    impl: str = "triton",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    memory_budget: int | None = None,
) -> MemoryPrediction:
    """Predicted peak extra bytes of ``vocab_parallel_linear_cross_entropy`` on process ``rank``
    of ``world_size`` (default rank 0, which holds the largest ``torch.chunk`` shard).

    Over the inputs (N·H hidden on every process, the (V_p, H) shard): the single-process
    model of the shard's V_p rows, with the chunk plan that :mod:`fusedce.parallel` takes
    (planned for ceil(V/P) rows on every process), plus the forward's collective buffer, a
    (3, R) (without label smoothing (2, R)) accumulation-dtype tensor made after each row
    chunk's blocks. It is counted on top of the blocks: the process group's finished work may
    keep the previous row chunk's buffer until the next chunk's blocks run (gloo does, from
    its worker thread). The backward's all-reduce works in place on the fp32 grad_hidden row sum.
    grad_hidden is N·H on every process: the per-process floor is N·H + V_p·H gradient bytes.
    """
    from fusedce.parallel import vocab_shard_bounds

    start, stop = vocab_shard_bounds(vocab_size, world_size, rank)
    largest = -(-vocab_size // world_size)
    plan = plan_chunks(n, h, largest, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                       compute_dtype=compute_dtype, chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
                       memory_budget=memory_budget)
    packed_rows = 3 if label_smoothing > 0 else 2
    return _predict(n, h, stop - start, plan, hidden_dtype, weight_dtype, compute_dtype, has_bias, bias_dtype, impl,
                    collective_rows=packed_rows)


def _predict(n: int, h: int, v: int, plan: ChunkPlan, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
             compute_dtype: torch.dtype, has_bias: bool, bias_dtype: torch.dtype | None, impl: str,
             collective_rows: int = 0) -> MemoryPrediction:
    """The model for ``v`` vocabulary rows walked with ``plan``; ``collective_rows`` (R,)
    vectors of the vocabulary-parallel forward's statistics buffer (0 in one process)."""
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    narrow_bias = has_bias and dtype_bytes(bias_dtype or weight_dtype) != acc

    def blocks(one_pass: ChunkPlan, widest: int | None) -> tuple[int, int, int, int]:
        """(rows, workspace, PyTorch path's forward extra, its backward extra) of one pass's blocks."""
        rows, cols = min(one_pass.rows, max(n, 1)), min(one_pass.cols, v)
        extra = (_torch_path_bytes(rows, cols, h, compute_dtype, narrow_bias, widest) if impl == "torch"
                 else (0, 0))
        return rows, _workspace_bytes(one_pass, rows, cols, h, hidden_dtype, weight_dtype, compute_dtype, impl), *extra

    split = plan.hidden_rows > 0  # a split's weight pass adds no product into an fp32 sum (module docstring)
    rows, workspace, forward_extra, backward_extra = blocks(plan.weight_pass(), 0 if split else None)
    forward_extra += collective_rows * rows * acc
    per_token = n * acc
    kept = n * min(plan.kept_cols, v) * dtype_bytes(compute_dtype)  # held from the forward to the backward's end
    # forward: 4 running statistics + lse + loss + a few (N,) temporaries of the loss formula
    forward = 8 * per_token + workspace + forward_extra + kept
    # backward: saved lse and the loss stay alive; gradients are allocated up front
    gradients = _gradient_bytes(n, h, v, plan, hidden_dtype, weight_dtype, compute_dtype, has_bias, bias_dtype)
    hidden_pass = plan.hidden_pass()
    if hidden_pass is None:
        backward = 6 * per_token + gradients + rows * h * acc + workspace + backward_extra + kept
    else:  # grad_hidden's pass (its accumulator, no weight gradient yet), then the weight's (no accumulator)
        hidden_rows, hidden_workspace, _, hidden_extra = blocks(hidden_pass, min(plan.hidden_rows, max(n, 1)))
        first = 6 * per_token + n * h * dtype_bytes(hidden_dtype) + hidden_rows * h * acc + hidden_workspace
        backward = max(first + hidden_extra, 6 * per_token + gradients + workspace + backward_extra)
    return MemoryPrediction(forward=forward, backward=backward, plan=plan)


def _workspace_bytes(plan: ChunkPlan, rows: int, cols: int, h: int, hidden_dtype: torch.dtype,
                     weight_dtype: torch.dtype, compute_dtype: torch.dtype, impl: str) -> int:
    """The buffers both passes reuse for every block of ``plan`` (``rows`` × ``cols``, both within
    the call's N and V): the logits block (half of it when the plan is ``tiled``: 2-byte
    gradients, no fp32 logits) and the converted hidden / weight chunks (when their dtype is not
    the compute dtype)."""
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    c = dtype_bytes(compute_dtype)
    # the Triton path runs on CUDA, where the block's rows are padded (passes.block_row_stride)
    device = torch.device("cuda" if impl == "triton" else "cpu")
    block = plan.block_elements(rows, cols, device) * acc
    hidden_chunk = rows * h * c if hidden_dtype != compute_dtype else 0
    weight_chunk = cols * h * c if weight_dtype != compute_dtype else 0
    return block + hidden_chunk + weight_chunk


def _torch_path_bytes(rows: int, cols: int, h: int, compute_dtype: torch.dtype,
                      narrow_bias: bool = False, widest: int | None = None) -> tuple[int, int]:
    """What the PyTorch path holds beyond the Triton path's buffers, (forward, backward).

    Forward: exp(z − max) is one more block (it outlives the matmul's own temporary); with a
    bias narrower than the block, the CPU widens the bias chunk (cols · acc bytes) while that
    block exists, which outweighs chunk_stats' three row vectors by (cols − 3·rows) · acc.
    Backward: the cast logit gradients are a block of their own, and without cuBLAS's fp32
    output each product exists once in the compute dtype before it is added into its fp32
    accumulator, a slice of rows at a time: the larger of grad_hidden's (rows × H) and a summed
    grad_weight's (cols × H), ``widest`` rows of H (None: max(rows, cols); 0: no such product).
    """
    acc_dtype = accumulation_dtype(compute_dtype)
    acc, c = dtype_bytes(acc_dtype), dtype_bytes(compute_dtype)
    forward = rows * cols * acc + (max(0, cols - 3 * rows) * acc if narrow_bias else 0)
    if compute_dtype == acc_dtype:
        return forward, 0
    widest = max(cols, rows) if widest is None else widest
    return forward, rows * cols * c + widest * h * c + min(widest, add_slice_rows(h, acc)) * h * acc


def _gradient_bytes(n: int, h: int, v: int, plan: ChunkPlan, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                    compute_dtype: torch.dtype, has_bias: bool, bias_dtype: torch.dtype | None) -> int:
    """The gradients in their dtypes, the bias gradient's fp32 sum, and the fp32 copy of a
    bf16/fp16 weight's gradient when its rows come in several row chunks."""
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    bias_bytes = v * dtype_bytes(bias_dtype or weight_dtype) + v * acc if has_bias else 0
    grads = gradient_floor_bytes(n, h, v, hidden_dtype, weight_dtype) + bias_bytes
    n_row_chunks = -(-max(n, 1) // plan.rows)
    weight_acc = v * h * acc if (weight_dtype != accumulation_dtype(compute_dtype) and n_row_chunks > 1
                                 and not plan.per_chunk) else 0
    return grads + weight_acc


def _current_tiled(h: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype, compute_dtype: torch.dtype) -> bool:
    """Whether the current CUDA device runs contiguous inputs of these dtypes through the tiled
    kernels (False without one). Asked with meta tensors: a CUDA tensor, even an empty one, would
    make a CUDA context in a process that may have none (the command line's own)."""
    if not torch.cuda.is_available():
        return False
    from fusedce.custom_op import tiles_planned

    return tiles_planned(torch.empty((0, h), dtype=hidden_dtype, device="meta"),
                         torch.empty((0, h), dtype=weight_dtype, device="meta"), compute_dtype,
                         torch.device("cuda", torch.cuda.current_device()))


def _current_sm_count(compute_dtype: torch.dtype) -> int | None:
    if not torch.cuda.is_available():
        return None
    from fusedce.matmul import split_k_sm_count

    return split_k_sm_count(torch.device("cuda", torch.cuda.current_device()), compute_dtype)


def _precompute_peaks(n: int, h: int, v: int, plan: ChunkPlan, *, hidden_dtype: torch.dtype,
                      weight_dtype: torch.dtype, compute_dtype: torch.dtype, has_bias: bool,
                      bias_dtype: torch.dtype | None, impl: str) -> MemoryPrediction:
    """Peaks of the precompute strategy (:func:`fusedce.precompute.loss_and_gradients`).

    Its forward holds, for the whole row loop: the token masks and factors, the gradients
    (allocated first), the four row statistics, and the workspace (converted weight, the
    rows × V block, converted hidden rows, split-K partials and stage, the ones vector);
    on top of that, the largest of the per-chunk temporaries (PyTorch path: the block's
    logits product in the compute dtype, chunk_stats' block-sized temporary with three row
    vectors, the cast logit gradients with the GEMMs' products in the compute dtype), or,
    after the loop, an fp32 grad_weight sum and its rounded copy. Its backward only scales
    the gradients in place (the PyTorch path widening a slice of at most 4 MiB at a time).
    """
    acc_dtype = accumulation_dtype(compute_dtype)
    acc, c = dtype_bytes(acc_dtype), dtype_bytes(compute_dtype)
    hb, wb = dtype_bytes(hidden_dtype), dtype_bytes(weight_dtype)
    bb = dtype_bytes(bias_dtype or weight_dtype) if has_bias else 0
    torch_path = impl == "torch"
    rows = min(plan.rows, max(n, 1))
    several = -(-max(n, 1) // plan.rows) > 1
    weight_sum = v * h * acc if (wb < acc and several and not plan.per_chunk) else 0
    grads = n * h * hb + (0 if weight_sum else v * h * wb) + weight_sum + (v * acc if has_bias else 0)
    vectors = n + 8 + n * acc + 4 * n * acc  # counted mask, count, token factors, row statistics
    stride = block_row_stride(v, torch.device("cpu" if torch_path else "cuda"))
    block = rows * stride * acc
    workspace = ((v * h * c if weight_dtype != compute_dtype else 0) + block
                 + (rows * h * c if hidden_dtype != compute_dtype else 0)
                 + (plan.split_k * rows * h * acc if plan.split_k > 1 else 0)
                 + (rows * h * acc if plan.split_k > 1 and hb != acc else 0)
                 + (rows * c if has_bias else 0))
    loop = 0
    if torch_path:
        narrow = c < acc  # products in the compute dtype before they reach a wider output
        logits = rows * v * c if narrow else 0
        # chunk_stats' block and its three row vectors; with a narrower bias, the CPU's
        # mixed-dtype add widens the bias first (V·acc bytes) while the block exists
        widened_bias = v * acc if has_bias and bb != acc else 0
        stats = rows * v * acc + max(3 * rows * acc, widened_bias)
        d = rows * v * c if narrow else 0
        products = [0]
        if narrow:
            slice_rows = add_slice_rows(h, acc)
            if wb >= acc or weight_sum:  # grad_weight (or its sum) in fp32: product, then added by slices
                products.append(v * h * c + (min(v, slice_rows) * h * acc if several else 0))
            if hidden_dtype != compute_dtype:  # an fp32 grad_hidden row chunk
                products.append(rows * h * c)
            if has_bias:  # the column sums' (1, V) product, then widened to be added
                products.append(v * c + v * acc)
        loop = max(logits, stats, d + max(products))
    forward_loop = vectors + grads + workspace + loop
    final_grads = n * h * hb + v * h * wb + (v * bb if has_bias else 0)
    # after the loop, the fp32 sum of a bf16/fp16 grad_weight and its rounded copy coexist
    finish = (n + 8 + 4 * n * acc + n * h * hb + (v * acc if has_bias else 0) + weight_sum + v * h * wb
              if weight_sum else 0)
    forward = max(forward_loop, finish)
    widen = 0
    if torch_path:
        sizes = [(n, h, hb), (v, h, wb)] + ([(1, v, bb)] if has_bias else [])
        widen = max((min(r, max(1, SCALE_SLICE_BYTES // max(1, k * acc))) * k * acc
                     for r, k, b in sizes if b < acc and r * k), default=0)
    loss = acc
    backward = final_grads + loss + acc + widen  # the gradients, the loss, its upstream gradient
    return MemoryPrediction(forward=forward, backward=backward, plan=plan)
