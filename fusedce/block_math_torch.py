"""The :class:`~fusedce.block_math.BlockMath` of plain PyTorch ops (``impl="torch"``, any device).

Contract and math: :mod:`fusedce.block_math`. Both functions first turn ``z`` in place
into the activated logits c; they also accept fp64 blocks (fp64 inputs). Block-sized
temporaries: ``chunk_stats`` one, exp(c − max); ``logit_grad`` the result when
``out_dtype`` is narrower than ``z`` (a cast copy), and with soft-capping the factor
1 − (c/s)² (two blocks while it is computed). :mod:`fusedce.memory_model` counts the
first two (it does not model soft-capping).
"""
from __future__ import annotations

import torch

from fusedce.stats import RowStats


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
    """:meth:`BlockMath.chunk_stats <fusedce.block_math.BlockMath.chunk_stats>`; leaves c in ``z``."""
    c = _activate(z, bias, softcap)
    block_max = c.amax(dim=1)
    new_max = torch.maximum(stats.max, block_max)
    block_sum = (c - new_max.unsqueeze(1)).exp_().sum(dim=1)  # one block-sized temporary
    stats.sumexp.mul_(torch.exp(stats.max - new_max)).add_(block_sum)
    stats.max.copy_(new_max)
    index, inside = _target_mask(target, col0, c.shape[1])
    stats.target_logit.add_(torch.where(inside, c.gather(1, index).squeeze(1), 0.0))
    if need_sum:
        stats.logit_sum.add_(c.sum(dim=1))


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
) -> torch.Tensor:
    """:meth:`BlockMath.logit_grad <fusedce.block_math.BlockMath.logit_grad>`.

    ``z`` becomes the gradients in the accumulation dtype; the result is ``z`` itself when
    ``out_dtype`` is that dtype, else a new (R, C) tensor cast from it.
    """
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
