"""The loss options a model's config asks for, and the cross-entropy that applies them.

A config can ask its loss for more than the plain cross-entropy: final-logit soft-capping
(``final_logit_softcapping``, Gemma 2; part of the model's forward, judged by the ``transform``
check), a z-loss (``z_loss``, ``z_loss_weight`` or ``z_loss_coefficient``: ``z · logsumexp(logits)²``
per token, PaLM) and label smoothing (``label_smoothing`` or Hugging Face's trainer name
``label_smoothing_factor``). :func:`options_of` reads them from the model source's config and
from ``model.config``; :func:`shifted_cross_entropy` is the loss the doctor's reference trains:

    per token t (label y_t ≠ ignore):  CE_ε(logits_t, y_t) + z · logsumexp(logits_t)²
    mean over those tokens (``reduction="mean"``), their sum (``"sum"``) or each (``"none"``, 0 at ignored)

where ``CE_ε`` is ``F.cross_entropy(..., label_smoothing=ε)``.

Public API: :class:`LossOptions`, :func:`options_of`, :func:`left_out`, :func:`shifted_cross_entropy`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusedce.options import IGNORE_INDEX

_LABEL_SMOOTHING = ("label_smoothing", "label_smoothing_factor")
_Z_LOSS = ("z_loss", "z_loss_weight", "z_loss_coefficient")


@dataclass(frozen=True)
class LossOptions:
    """``label_smoothing`` ε ∈ [0, 1) and ``z_loss`` weight z ≥ 0 (0: off)."""

    label_smoothing: float = 0.0
    z_loss: float = 0.0

    def active(self) -> dict[str, float]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}

    def describe(self) -> str:
        parts = [f"label smoothing {self.label_smoothing:g}" if self.label_smoothing else "",
                 f"z-loss {self.z_loss:g}" if self.z_loss else ""]
        return ", ".join(p for p in parts if p) or "none"


def left_out(options: LossOptions) -> list[tuple[str, LossOptions]]:
    """``(name, options)`` with each active option left out, then both when both are active:
    the reference a wrapper that forgot them would match (``"without label smoothing"``, …)."""
    out = []
    if options.label_smoothing:
        out.append(("without label smoothing", dataclasses.replace(options, label_smoothing=0.0)))
    if options.z_loss:
        out.append(("without z-loss", dataclasses.replace(options, z_loss=0.0)))
    if options.label_smoothing and options.z_loss:
        out.append(("without label smoothing and z-loss", LossOptions()))
    return out


def _first(config, names) -> float:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            return float(value)
    return 0.0


def options_of(*configs) -> LossOptions:
    """The options the first config that sets each asks for (``None`` configs are skipped)."""
    present = [c for c in configs if c is not None]
    smoothing = next((v for v in (_first(c, _LABEL_SMOOTHING) for c in present) if v), 0.0)
    z_loss = next((v for v in (_first(c, _Z_LOSS) for c in present) if v), 0.0)
    return LossOptions(smoothing, z_loss)


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, options: LossOptions = LossOptions(),
                          reduction: str = "mean") -> torch.Tensor:
    """The loss of ``logits`` (B, T, V) any float dtype against ``labels`` (B, T) int64, position t
    predicting ``labels[:, t + 1]``, with ``options``; computed in fp32 (float64 stays float64).
    Returns a scalar (``mean``/``sum``) or (B, T−1) (``none``)."""
    logits = logits[:, :-1]
    logits = logits.float() if logits.dtype != torch.float64 else logits
    target = labels[:, 1:]
    flat, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    per_token = F.cross_entropy(flat, flat_target, ignore_index=IGNORE_INDEX, reduction="none",
                                label_smoothing=options.label_smoothing)
    valid = flat_target != IGNORE_INDEX
    if options.z_loss:
        per_token = per_token + options.z_loss * torch.where(valid, torch.logsumexp(flat, -1) ** 2, 0.0)
    if reduction == "none":
        return per_token.reshape(target.shape)
    total = per_token.sum()
    return total if reduction == "sum" else total / valid.sum()
