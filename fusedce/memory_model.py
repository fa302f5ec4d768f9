"""Analytic peak memory of one fusedce forward+backward, for the profiler's predicted column.

Counts the tensors :mod:`fusedce.passes` allocates (see its docstring and DESIGN.md), in
bytes, as "extra over the baseline where the inputs already exist". The prediction is for
the Triton path on CUDA (cuBLAS writes fp32 results directly, the logit gradients overwrite
the logits block in place); the PyTorch path creates a few more block-sized temporaries,
counted when ``impl="torch"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce.matmul import add_slice_rows
from fusedce.passes import accumulation_dtype, block_row_stride
from fusedce.planner import ChunkPlan, dtype_bytes, plan_chunks


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
) -> MemoryPrediction:
    """Predicted peak extra bytes of ``linear_cross_entropy`` forward and backward."""
    plan = plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                       chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget)
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    c = dtype_bytes(compute_dtype)
    rows, cols = min(plan.rows, max(n, 1)), min(plan.cols, v)
    # the Triton path runs on CUDA, where the block's rows are padded (passes.block_row_stride)
    block = rows * block_row_stride(cols, torch.device("cuda" if impl == "triton" else "cpu")) * acc
    hidden_chunk = rows * h * c if hidden_dtype != compute_dtype else 0
    weight_chunk = cols * h * c if weight_dtype != compute_dtype else 0
    forward_extra = backward_extra = 0
    if impl == "torch":
        # forward: exp(z − max) is one more block (it outlives the matmul's own temporary);
        # backward: the cast logit gradients are a block of their own, and without cuBLAS's
        # fp32 output each product exists once in the compute dtype before it is added
        forward_extra = rows * cols * acc
        if compute_dtype != accumulation_dtype(compute_dtype):
            # (and each product is added into its fp32 accumulator a slice of rows at a time)
            widest = max(cols, rows)
            backward_extra = rows * cols * c + widest * h * c + min(widest, add_slice_rows(h, acc)) * h * acc
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
