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
    memory_budget: int | None = None,
) -> MemoryPrediction:
    """Predicted peak extra bytes of ``linear_cross_entropy`` forward and backward."""
    plan = plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype, compute_dtype=compute_dtype,
                       chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget)
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    rows, cols = min(plan.rows, max(n, 1)), min(plan.cols, v)
    workspace = _workspace_bytes(rows, cols, h, hidden_dtype, weight_dtype, compute_dtype, impl)
    forward_extra, backward_extra = _torch_path_bytes(rows, cols, h, compute_dtype) if impl == "torch" else (0, 0)
    per_token = n * acc
    # forward: 4 running statistics + lse + loss + a few (N,) temporaries of the loss formula
    forward = 8 * per_token + workspace + forward_extra
    # backward: saved lse and the loss stay alive; gradients are allocated up front
    backward = (6 * per_token + _gradient_bytes(n, h, v, plan, hidden_dtype, weight_dtype, compute_dtype, has_bias,
                                                bias_dtype)
                + rows * h * acc + workspace + backward_extra)
    return MemoryPrediction(forward=forward, backward=backward, plan=plan)


def _workspace_bytes(rows: int, cols: int, h: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                     compute_dtype: torch.dtype, impl: str) -> int:
    """The buffers both passes reuse for every block: the logits block and the converted
    hidden / weight chunks (when their dtype is not the compute dtype)."""
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    c = dtype_bytes(compute_dtype)
    # the Triton path runs on CUDA, where the block's rows are padded (passes.block_row_stride)
    block = rows * block_row_stride(cols, torch.device("cuda" if impl == "triton" else "cpu")) * acc
    hidden_chunk = rows * h * c if hidden_dtype != compute_dtype else 0
    weight_chunk = cols * h * c if weight_dtype != compute_dtype else 0
    return block + hidden_chunk + weight_chunk


def _torch_path_bytes(rows: int, cols: int, h: int, compute_dtype: torch.dtype) -> tuple[int, int]:
    """What the PyTorch path holds beyond the Triton path's buffers, (forward, backward).

    Forward: exp(z − max) is one more block (it outlives the matmul's own temporary).
    Backward: the cast logit gradients are a block of their own, and without cuBLAS's fp32
    output each product exists once in the compute dtype before it is added into its fp32
    accumulator, a slice of rows at a time.
    """
    acc_dtype = accumulation_dtype(compute_dtype)
    acc, c = dtype_bytes(acc_dtype), dtype_bytes(compute_dtype)
    forward = rows * cols * acc
    if compute_dtype == acc_dtype:
        return forward, 0
    widest = max(cols, rows)
    return forward, rows * cols * c + widest * h * c + min(widest, add_slice_rows(h, acc)) * h * acc


def _gradient_bytes(n: int, h: int, v: int, plan: ChunkPlan, hidden_dtype: torch.dtype, weight_dtype: torch.dtype,
                    compute_dtype: torch.dtype, has_bias: bool, bias_dtype: torch.dtype | None) -> int:
    """The gradients in their dtypes, the bias gradient's fp32 sum, and the fp32 copy of a
    bf16/fp16 weight's gradient when its rows come in several row chunks."""
    acc = dtype_bytes(accumulation_dtype(compute_dtype))
    bias_bytes = v * dtype_bytes(bias_dtype or weight_dtype) + v * acc if has_bias else 0
    grads = gradient_floor_bytes(n, h, v, hidden_dtype, weight_dtype) + bias_bytes
    n_row_chunks = -(-max(n, 1) // plan.rows)
    weight_acc = v * h * acc if (weight_dtype != accumulation_dtype(compute_dtype) and n_row_chunks > 1) else 0
    return grads + weight_acc
