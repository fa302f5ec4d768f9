"""The loss as a ``torch.library`` custom op with its autograd formula.

Dynamo treats ``fusedce::forward`` / ``fusedce::backward`` as opaque ops (their fake
implementations give output shapes), so a model that calls ``linear_cross_entropy``
inside ``torch.compile`` compiles without tracing Triton internals, and eager and compiled
runs execute the same kernels. Autograd is attached with ``register_autograd``: the forward
saves only the inputs and the per-token lse (N floats).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from fusedce import block_math_torch, passes
from fusedce.block_math import BlockMath
from fusedce.options import LossOptions
from fusedce.planner import ChunkPlan


def _block_math(impl: str) -> BlockMath:
    """The module doing the per-block softmax math for ``impl`` ("torch" or "triton")."""
    if impl == "triton":
        from fusedce import kernels

        return kernels
    return block_math_torch


def _options(ignore_index: int, label_smoothing: float, z_loss: float, softcap: float) -> LossOptions:
    return LossOptions(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                       softcap=softcap if softcap > 0 else None)


@torch.library.custom_op("fusedce::forward", mutates_args=())
def forward_op(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    compute_dtype: torch.dtype, impl: str, rows: int, cols: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss per token (N,), lse (N,)), fp32 (fp64 for fp64 compute). hidden is (N, H)."""
    opts = _options(ignore_index, label_smoothing, z_loss, softcap)
    plan = ChunkPlan(rows=rows, cols=cols)
    return passes.forward(hidden, weight, target, bias, opts, compute_dtype, plan, _block_math(impl))


@forward_op.register_fake
def _forward_fake(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
                  compute_dtype, impl, rows, cols):
    acc = passes.accumulation_dtype(compute_dtype)
    n = hidden.shape[0]
    return hidden.new_empty((n,), dtype=acc), hidden.new_empty((n,), dtype=acc)


@torch.library.custom_op("fusedce::backward", mutates_args=())
def backward_op(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: Optional[torch.Tensor], lse: torch.Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    compute_dtype: torch.dtype, impl: str, rows: int, cols: int,
    need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_hidden, grad_weight, grad_bias); a gradient not asked for is an empty tensor."""
    opts = _options(ignore_index, label_smoothing, z_loss, softcap)
    plan = ChunkPlan(rows=rows, cols=cols)
    gh, gw, gb = passes.backward(grad_loss, hidden, weight, target, bias, lse, opts, compute_dtype, plan,
                                  _block_math(impl), need_hidden=need_hidden, need_weight=need_weight,
                                  need_bias=need_bias)
    # a gradient not asked for is a fresh empty tensor (custom-op outputs may not alias each other)
    return tuple(hidden.new_empty((0,)) if g is None else g for g in (gh, gw, gb))


@backward_op.register_fake
def _backward_fake(grad_loss, hidden, weight, target, bias, lse, ignore_index, label_smoothing, z_loss,
                   softcap, compute_dtype, impl, rows, cols, need_hidden, need_weight, need_bias):
    return (torch.empty_like(hidden) if need_hidden else hidden.new_empty((0,)),
            weight.new_empty(weight.shape) if need_weight else hidden.new_empty((0,)),
            bias.new_empty(bias.shape) if (need_bias and bias is not None) else hidden.new_empty((0,)))


def _setup_context(ctx, inputs, output):
    (hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
     compute_dtype, impl, rows, cols) = inputs
    _, lse = output
    ctx.save_for_backward(hidden, weight, target, bias, lse)
    ctx.args = (ignore_index, label_smoothing, z_loss, softcap, compute_dtype, impl, rows, cols)


def _backward(ctx, grad_loss, _grad_lse):
    hidden, weight, target, bias, lse = ctx.saved_tensors
    need = ctx.needs_input_grad
    gh, gw, gb = backward_op(grad_loss, hidden, weight, target, bias, lse, *ctx.args,
                             need[0], need[1], bias is not None and need[3])
    return (gh if need[0] else None, gw if need[1] else None, None,
            gb if (bias is not None and need[3]) else None) + (None,) * 8


forward_op.register_autograd(_backward, setup_context=_setup_context)


def triton_available(device: torch.device) -> bool:
    """Whether impl='triton' can run on tensors of ``device``."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"
