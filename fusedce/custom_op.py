"""The loss as a ``torch.library`` custom op with its autograd formula.

Dynamo treats ``fusedce::forward`` / ``fusedce::backward`` as opaque ops (their fake
implementations give output shapes), so a model that calls ``linear_cross_entropy``
inside ``torch.compile`` compiles without tracing Triton internals, and eager and compiled
runs execute the same kernels. Autograd is attached with ``register_autograd``: the forward
saves only the inputs and the per-token lse (N floats), and, for a plan that keeps logits
(:mod:`fusedce.kept_plan`), its third output: the (N, K) logits the backward reads.

The precompute strategy is a third op, ``fusedce::loss_and_grads``: it returns the scalar
loss together with its gradients for an upstream gradient of 1; its autograd formula
multiplies those saved gradients in place by the real upstream gradient
(``fusedce::scale_``, a mutating op, so the backward traces under torch.compile too) and
refuses a second backward through the same graph (the gradients were handed out).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from fusedce import block_math_torch, passes, precompute
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
    compute_dtype: torch.dtype, impl: str, rows: int, cols: int, per_chunk: bool = False, tiled: bool = False,
    hidden_rows: int = 0, hidden_cols: int = 0, kept_cols: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss per token (N,), lse (N,)), fp32 (fp64 for fp64 compute), and the kept logits
    (N, ``kept_cols``) in the compute dtype (N × 0 when none are kept). hidden is (N, H).
    ``per_chunk``, ``hidden_rows``, ``hidden_cols`` are backward's (a bf16/fp16 grad_weight rounded
    once per row chunk; a split backward's grad_hidden blocks); ``rows``, ``cols``, ``tiled``,
    ``kept_cols``: the :class:`~fusedce.planner.ChunkPlan`."""
    opts = _options(ignore_index, label_smoothing, z_loss, softcap)
    plan = ChunkPlan(rows=rows, cols=cols, tiled=tiled)
    kept = torch.empty(hidden.shape[0], kept_cols, device=hidden.device, dtype=compute_dtype)
    loss, lse = passes.forward(hidden, weight, target, bias, opts, compute_dtype, plan, _block_math(impl),
                               kept=kept if kept_cols else None)
    return loss, lse, kept


@forward_op.register_fake
def _forward_fake(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
                  compute_dtype, impl, rows, cols, per_chunk=False, tiled=False, hidden_rows=0, hidden_cols=0,
                  kept_cols=0):
    acc = passes.accumulation_dtype(compute_dtype)
    n = hidden.shape[0]
    return (hidden.new_empty((n,), dtype=acc), hidden.new_empty((n,), dtype=acc),
            hidden.new_empty((n, kept_cols), dtype=compute_dtype))


@torch.library.custom_op("fusedce::backward", mutates_args=())
def backward_op(
    grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: Optional[torch.Tensor], lse: torch.Tensor, kept: torch.Tensor,
    ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
    compute_dtype: torch.dtype, impl: str, rows: int, cols: int, per_chunk: bool, tiled: bool,
    need_hidden: bool, need_weight: bool, need_bias: bool, hidden_rows: int = 0, hidden_cols: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_hidden, grad_weight, grad_bias); a gradient not asked for is an empty tensor.
    ``kept``: the forward's kept logits (N, K), read only (K = 0: none)."""
    opts = _options(ignore_index, label_smoothing, z_loss, softcap)
    plan = ChunkPlan(rows=rows, cols=cols, per_chunk=per_chunk, tiled=tiled, hidden_rows=hidden_rows,
                     hidden_cols=hidden_cols)
    gh, gw, gb = passes.backward(grad_loss, hidden, weight, target, bias, lse, opts, compute_dtype, plan,
                                  _block_math(impl), need_hidden=need_hidden, need_weight=need_weight,
                                  need_bias=need_bias, kept=kept if kept.shape[1] else None)
    # a gradient not asked for is a fresh empty tensor (custom-op outputs may not alias each other)
    return tuple(hidden.new_empty((0,)) if g is None else g for g in (gh, gw, gb))


@backward_op.register_fake
def _backward_fake(grad_loss, hidden, weight, target, bias, lse, kept, ignore_index, label_smoothing, z_loss,
                   softcap, compute_dtype, impl, rows, cols, per_chunk, tiled, need_hidden, need_weight, need_bias,
                   hidden_rows=0, hidden_cols=0):
    return (torch.empty_like(hidden) if need_hidden else hidden.new_empty((0,)),
            weight.new_empty(weight.shape) if need_weight else hidden.new_empty((0,)),
            bias.new_empty(bias.shape) if (need_bias and bias is not None) else hidden.new_empty((0,)))


def _setup_context(ctx, inputs, output):
    (hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
     compute_dtype, impl, rows, cols, per_chunk, tiled, hidden_rows, hidden_cols, kept_cols) = inputs
    _, lse, kept = output
    ctx.mark_non_differentiable(kept)
    ctx.set_materialize_grads(False)  # else the backward gets a zero (N, K) gradient for the kept logits
    ctx.save_for_backward(hidden, weight, target, bias, lse, kept)
    ctx.args = (ignore_index, label_smoothing, z_loss, softcap, compute_dtype, impl, rows, cols, per_chunk, tiled)
    ctx.split = (hidden_rows, hidden_cols)


def _backward(ctx, grad_loss, _grad_lse, _grad_kept):
    hidden, weight, target, bias, lse, kept = ctx.saved_tensors
    need = ctx.needs_input_grad
    if grad_loss is None:  # only lse was used downstream: it carries no gradient
        grad_loss = torch.zeros_like(lse)
    gh, gw, gb = backward_op(grad_loss, hidden, weight, target, bias, lse, kept, *ctx.args,
                             need[0], need[1], bias is not None and need[3], *ctx.split)
    return (gh if need[0] else None, gw if need[1] else None, None,
            gb if (bias is not None and need[3]) else None) + (None,) * 13


forward_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("fusedce::loss_and_grads", mutates_args=())
def loss_and_grads_op(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, reduction: str, label_smoothing: float, z_loss: float, softcap: float,
    compute_dtype: torch.dtype, impl: str, rows: int, split_k: int, per_chunk: bool,
    need_hidden: bool, need_weight: bool, need_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (), grad_hidden, grad_weight, grad_bias) for ``reduction`` "mean"/"sum": the
    precompute strategy (:func:`fusedce.precompute.loss_and_gradients`). A gradient not asked
    for is an empty tensor."""
    opts = LossOptions(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap if softcap > 0 else None)
    plan = ChunkPlan(rows=rows, cols=weight.shape[0], strategy="precompute", per_chunk=per_chunk, split_k=split_k)
    loss, gh, gw, gb = precompute.loss_and_gradients(hidden, weight, target, bias, opts, compute_dtype, plan,
                                                     _block_math(impl), need_hidden=need_hidden,
                                                     need_weight=need_weight, need_bias=need_bias)
    return (loss,) + tuple(hidden.new_empty((0,)) if g is None else g for g in (gh, gw, gb))


@loss_and_grads_op.register_fake
def _loss_and_grads_fake(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
                         softcap, compute_dtype, impl, rows, split_k, per_chunk, need_hidden, need_weight, need_bias):
    loss = hidden.new_empty((), dtype=passes.accumulation_dtype(compute_dtype))
    return (loss,) + _backward_fake(None, hidden, weight, target, bias, None, None, ignore_index, label_smoothing,
                                    z_loss, softcap, compute_dtype, impl, rows, 0, per_chunk, False, need_hidden,
                                    need_weight, need_bias)


@torch.library.custom_op("fusedce::scale_", mutates_args=("grad",))
def scale_op(grad: torch.Tensor, factor: torch.Tensor, impl: str) -> None:
    """In place: ``grad *= factor`` (0-d, accumulation dtype), in the factor's precision."""
    _block_math(impl).scale_(grad, factor)


@scale_op.register_fake
def _scale_fake(grad, factor, impl):
    return None


def _setup_precomputed(ctx, inputs, output):
    _, gh, gw, gb = output
    ctx.mark_non_differentiable(gh, gw, gb)
    ctx.set_materialize_grads(False)  # else backward gets zero tensors for the three gradient outputs
    ctx.save_for_backward(gh, gw, gb)
    ctx.impl = inputs[10]
    ctx.acc = passes.accumulation_dtype(inputs[9])
    ctx.handed_out = False


def _backward_precomputed(ctx, grad_loss, _gh, _gw, _gb):
    if ctx.handed_out:
        raise RuntimeError(
            "fusedce computed this loss's gradients during the forward pass (strategy='precompute') and has "
            "already handed them out; to backward through the same graph twice (retain_graph=True), call "
            "linear_cross_entropy with strategy='recompute'")
    ctx.handed_out = True
    gh, gw, gb = ctx.saved_tensors
    need = ctx.needs_input_grad
    factor = grad_loss.to(ctx.acc).reshape(())
    wanted = [(g, n) for g, n in ((gh, need[0]), (gw, need[1]), (gb, need[3])) if n and g.numel()]
    for g, _ in wanted:
        scale_op(g, factor, ctx.impl)
    return (gh if need[0] else None, gw if need[1] else None, None,
            gb if (need[3] and gb.numel()) else None) + (None,) * 13


loss_and_grads_op.register_autograd(_backward_precomputed, setup_context=_setup_precomputed)


def triton_available(device: torch.device) -> bool:
    """Whether impl='triton' can run on tensors of ``device``."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"


def tiles_planned(hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype,
                  device: torch.device | None = None) -> bool:
    """Whether ``impl="triton"`` will run this call's blocks through the tiled kernels
    (:func:`fusedce.kernels.tiles_planned`; False where this Triton has no tensor descriptors)."""
    from fusedce import kernels

    planned = getattr(kernels, "tiles_planned", None)
    return planned is not None and planned(hidden, weight, compute_dtype, device)
