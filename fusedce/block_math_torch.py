"""The per-chunk softmax math in plain PyTorch (the CPU implementation).

Same contract as the Triton launchers in :mod:`fusedce.kernels`; see there for the math.
These functions work on one ``(R, C)`` block of raw logits ``z = hidden @ weight[c0:c1].T``
in the accumulation dtype (fp32, or fp64 for fp64 inputs) and overwrite it.
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
    """Fold the block ``z`` (R, C) of vocabulary columns ``[col0, col0 + C)`` into ``stats``."""
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
    """d loss_n / d z_nv for the block, times ``row_scale[n]``, returned in ``out_dtype``.

    Overwrites ``z``; the only new block-sized tensors are the cast result (and the soft-cap
    factor when soft-capping).
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
