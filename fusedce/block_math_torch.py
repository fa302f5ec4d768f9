"""The :class:`~fusedce.block_math.BlockMath` of plain PyTorch ops (``impl="torch"``, any device).

Contract and math: :mod:`fusedce.block_math`. They also accept fp64 blocks (fp64 inputs).
Block-sized temporaries: ``chunk_stats`` one (the activated logits c when there is a bias
or a soft-cap, else exp(z − max); ``z`` itself is left unchanged); ``logit_grad`` turns ``z``
into c and then the gradients in place, plus the result when ``out_dtype`` is narrower
than ``z`` (a cast copy), and with soft-capping the factor 1 − (c/s)² (two blocks while it
is computed). :mod:`fusedce.memory_model` counts the first two (it does not model
soft-capping). Kept 2-byte logits (:mod:`fusedce.kept_plan`) are widened into one more block
first (the planner keeps logits only for the Triton path, whose kernels read them as they are).
``scale_`` widens a slice of at most ``SCALE_SLICE_BYTES`` at a time.
"""
from __future__ import annotations

import torch

from fusedce.stats import RowStats

SCALE_SLICE_BYTES = 4 << 20  # bytes of a widened slice in scale_


def _activate(z: torch.Tensor, bias: torch.Tensor | None, softcap: float) -> torch.Tensor:
    """In place: z ← softcap·tanh((z + bias)/softcap) (each step only when enabled)."""
    if bias is not None:
        z.add_(bias.to(z.dtype))
    if softcap:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def _target_mask(target: torch.Tensor, col0: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    local = target - col0
    inside = (local >= 0) & (local < n_cols)
    return local.clamp(0, n_cols - 1).unsqueeze(1), inside


def chunk_stats(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    col0: int,
    target: torch.Tensor,
    stats: RowStats,
    *,
    softcap: float,
    need_sum: bool,
) -> None:
    """:meth:`BlockMath.chunk_stats <fusedce.block_math.BlockMath.chunk_stats>`; leaves ``z`` unchanged.

    The target's logit is gathered from ``z`` and activated on its own, before the block's
    one temporary exists (so the small row temporaries never coexist with it). A 2-byte ``z``
    (kept logits) is widened first: one more block in the accumulation dtype."""
    if z.element_size() < stats.max.element_size():
        z = z.to(stats.max.dtype)
    index, inside = _target_mask(target, col0, z.shape[1])
    picked = _activate(z.gather(1, index).squeeze(1), None if bias is None else bias[index.squeeze(1)], softcap)
    stats.target_logit.add_(torch.where(inside, picked, 0.0))
    del index, inside, picked
    if bias is not None:  # one block-sized temporary (the bias widened on the fly, not copied)
        c = _activate(torch.add(z, bias), None, softcap)
    else:
        c = _activate(z.clone(), None, softcap) if softcap else z
    block_max = c.amax(dim=1)
    new_max = torch.maximum(stats.max, block_max)
    if need_sum:
        stats.logit_sum.add_(c.sum(dim=1))
    shifted = c.sub_(new_max.unsqueeze(1)) if c is not z else c - new_max.unsqueeze(1)  # ... or this one
    block_sum = shifted.exp_().sum(dim=1)
    del c, shifted  # the block-sized temporary goes before the row statistics are merged
    stats.sumexp.mul_(torch.exp(stats.max - new_max)).add_(block_sum)
    stats.max.copy_(new_max)


def logit_grad(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    col0: int,
    target: torch.Tensor,
    lse: torch.Tensor,
    row_scale: torch.Tensor,
    *,
    vocab: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:meth:`BlockMath.logit_grad <fusedce.block_math.BlockMath.logit_grad>`.

    ``z`` becomes the gradients in the accumulation dtype; the result is ``z`` itself when
    ``out_dtype`` is that dtype, else a new (R, C) tensor cast from it. With ``out``, ``z`` (any
    floating dtype) is copied into a block of the accumulation dtype first and left unchanged; the
    result is ``out``.
    """
    if out is not None:
        out.copy_(logit_grad(z.to(lse.dtype, copy=True), bias, col0, target, lse, row_scale, vocab=vocab,
                             label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap, out_dtype=lse.dtype))
        return out
    c = _activate(z, bias, softcap)
    cap = 1.0 - (c / softcap) ** 2 if softcap else None
    dc = c.sub_(lse.unsqueeze(1)).exp_()  # p = softmax, in place over the block
    if z_loss:
        dc.mul_((1.0 + 2.0 * z_loss * lse).unsqueeze(1))
    index, inside = _target_mask(target, col0, c.shape[1])
    dc.scatter_add_(1, index, (inside.to(dc.dtype) * -(1.0 - label_smoothing)).unsqueeze(1))
    if label_smoothing:
        dc.sub_(label_smoothing / vocab)
    if softcap:
        dc.mul_(cap)
    dc.mul_(row_scale.unsqueeze(1))
    return dc.to(out_dtype)


def scale_(grad: torch.Tensor, factor: torch.Tensor) -> None:
    """:meth:`BlockMath.scale_ <fusedce.block_math.BlockMath.scale_>`: ``grad *= factor`` in
    ``factor``'s dtype, a narrower ``grad`` widened one slice of rows at a time."""
    if grad.numel() == 0:
        return
    if grad.dtype == factor.dtype or grad.element_size() >= factor.element_size():
        grad.mul_(factor.to(grad.dtype))
        return
    flat = grad.view(grad.shape[0], -1) if grad.dim() > 1 else grad.view(1, -1)
    step = max(1, SCALE_SLICE_BYTES // max(1, flat.shape[1] * factor.element_size()))
    for r0 in range(0, flat.shape[0], step):
        part = flat[r0: r0 + step]
        part.copy_(part.to(factor.dtype).mul_(factor))
