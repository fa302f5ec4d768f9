"""Analytic peak memory of one fusedce forward+backward, for the profiler's predicted column.

Counts the tensors :mod:`fusedce.chunked` allocates (see its docstring and DESIGN.md), in
bytes, as "extra over the baseline where the inputs already exist". The prediction is for
the Triton path on CUDA (cuBLAS writes fp32 results directly, the logit gradients overwrite
the logits block in place); the PyTorch path creates a few more block-sized temporaries,
counted when ``impl="torch"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce.chunked import accumulation_dtype, block_row_stride
from fusedce.chunking import ChunkPlan, dtype_bytes, plan_chunks


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
    memory_budget: int | None = None,
    reduction: str = "mean",
    strategy: str = "auto",
) -> MemoryPrediction:
    """Predicted peak extra bytes of ``linear_cross_entropy`` forward and backward, for a
    call whose gradients are all needed (a training step)."""
    plan = plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                       chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget,
                       strategy=strategy, scalar_loss=reduction != "none", needs_grad=True)
    if plan.strategy == "precompute":
        return _precompute_peaks(n, h, v, plan, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                                 compute_dtype=compute_dtype, has_bias=has_bias, bias_dtype=bias_dtype, impl=impl)
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    c = dtype_bytes(compute_dtype)
    rows, cols = min(plan.rows, max(n, 1)), min(plan.cols, v)
    block = rows * _block_stride(cols, impl) * acc
    hidden_chunk = rows * h * c if hidden_dtype != compute_dtype else 0
    weight_chunk = cols * h * c if weight_dtype != compute_dtype else 0
    forward_extra = backward_extra = 0
    if impl == "torch":
        # forward: exp(z − max) is one more block (it outlives the matmul's own temporary);
        # backward: the cast logit gradients are a block of their own, and without cuBLAS's
        # fp32 output each product exists once in the compute dtype before it is added
        forward_extra = rows * cols * acc
        if compute_dtype != accumulation_dtype(compute_dtype):
            backward_extra = rows * cols * c + max(cols, rows) * h * c
    per_token = n * acc
    # forward: 4 running statistics + lse + loss + a few (N,) temporaries of the loss formula
    forward = 8 * per_token + block + hidden_chunk + weight_chunk + forward_extra
    # backward: saved lse and the loss stay alive; gradients are allocated up front
    bias_bytes = v * dtype_bytes(bias_dtype or weight_dtype) + v * acc if has_bias else 0
    grads = n * h * dtype_bytes(hidden_dtype) + v * h * dtype_bytes(weight_dtype) + bias_bytes
    n_row_chunks = -(-max(n, 1) // plan.rows)
    weight_acc = v * h * acc if (weight_dtype != accumulation_dtype(compute_dtype) and n_row_chunks > 1) else 0
    backward = (6 * per_token + grads + weight_acc + rows * h * acc + block + hidden_chunk + weight_chunk
                + backward_extra)
    return MemoryPrediction(forward=forward, backward=backward, plan=plan)


def _precompute_peaks(n: int, h: int, v: int, plan: ChunkPlan, *, hidden_dtype: torch.dtype,
                      weight_dtype: torch.dtype, compute_dtype: torch.dtype, has_bias: bool,
                      bias_dtype: torch.dtype | None, impl: str) -> MemoryPrediction:
    """Peaks of the precompute strategy (:func:`fusedce.chunked.loss_and_gradients`).

    Its forward holds the gradients (allocated up front), the converted weight, one fp32
    ``rows × V`` block and O(N) vectors; its backward only scales the gradients in place.
    """
    acc_dtype = accumulation_dtype(compute_dtype)
    acc, c = dtype_bytes(acc_dtype), dtype_bytes(compute_dtype)
    rows = min(plan.rows, max(n, 1))
    block = rows * _block_stride(v, impl) * acc
    hidden_stage = rows * h * acc if dtype_bytes(hidden_dtype) != acc else 0
    hidden_stage += _split_k_slices(rows, h, v, impl) * rows * h * acc if _split_k_slices(rows, h, v, impl) > 1 else 0
    hidden_chunk = rows * h * c if hidden_dtype != compute_dtype else 0
    weight_copy = v * h * c if weight_dtype != compute_dtype else 0
    n_row_chunks = -(-max(n, 1) // plan.rows)
    weight_acc = v * h * acc if (weight_dtype != acc_dtype and n_row_chunks > 1) else 0
    bias_bytes = v * dtype_bytes(bias_dtype or weight_dtype) + v * acc if has_bias else 0
    grads = n * h * dtype_bytes(hidden_dtype) + (0 if weight_acc else v * h * dtype_bytes(weight_dtype))
    loop_extra = 0
    if impl == "torch":
        # the statistics' exp temporary is a block; the cast logit gradients (and, without
        # cuBLAS's fp32 output, each product in the compute dtype) exist during the GEMMs
        gemm_phase = (rows * v * c + v * h * c) if compute_dtype != acc_dtype else 0
        loop_extra = max(block, gemm_phase)
    # row statistics (4), lse, upstream gradients, and the where() temporaries of the latter
    vectors = 8 * n * acc
    loop = vectors + grads + weight_acc + bias_bytes + weight_copy + block + hidden_chunk + hidden_stage + loop_extra
    # after the loop, an fp32 grad_weight accumulator is rounded into the bf16/fp16 output
    final = vectors + grads + bias_bytes + (weight_acc + v * h * dtype_bytes(weight_dtype) if weight_acc else 0)
    forward = max(loop, final)
    step_grads = n * h * dtype_bytes(hidden_dtype) + v * h * dtype_bytes(weight_dtype) + bias_bytes
    # backward widens bf16/fp16 gradients to the factor's dtype 4096 rows at a time
    widen = min(4096, max(v, n)) * h * acc if min(dtype_bytes(hidden_dtype), dtype_bytes(weight_dtype)) < acc else 0
    return MemoryPrediction(forward=forward, backward=step_grads + widen, plan=plan)


def _block_stride(cols: int, impl: str) -> int:
    """Row stride of the logits block: padded on CUDA (the Triton path), exact elsewhere."""
    return block_row_stride(cols, torch.device("cuda" if impl == "triton" else "cpu"))


def _split_k_slices(rows: int, h: int, v: int, impl: str) -> int:
    """The split-K count of the grad_hidden GEMM on the GPU of this process (1 off CUDA)."""
    if impl != "triton" or not torch.cuda.is_available():
        return 1
    from fusedce.matmul import split_k_count

    return split_k_count(rows, h, v, torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
