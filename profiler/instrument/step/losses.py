"""The profiler's loss back-ends, as the model mode calls them.

A back-end is ``(hidden, weight, target, bias, options) -> loss`` (see
:mod:`fusedce_profiler.instrument.backends`): here ``hidden`` is the model's (B·T, H) final hidden states,
``weight`` the LM head's (V, H) parameter itself (the embedding when tied), ``target`` the
(B·T,) next tokens. :func:`resolve_backend` adds what a training run needs on top of the
registry: a clear "cannot run here" (:class:`BackendUnavailable`, reported as ``skipped``)
before any model is built. :func:`unrounded_logits_loss` is a control for parity runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import Backend, LossFn, Replacement, get_backend, get_model_backend, torch_loss
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.records import CellSpec


class BackendUnavailable(RuntimeError):
    """The back-end is known but cannot run here (not installed, wrong device, option unsupported)."""


@dataclass(frozen=True)
class LossBackend:
    """A resolved back-end: its name, its loss function and the version of the package behind it."""

    name: str
    fn: LossFn
    version: str


def loss_options(config: ModelConfig, reduction: str = "mean", ignore_index: int = -100) -> LossOptions:
    """The options a training step of ``config`` uses: its soft-cap, no smoothing or z-loss."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return LossOptions(ignore_index=ignore_index, reduction=reduction, softcap=config.final_logit_softcapping)


def resolve_backend(name: str, config: ModelConfig, options: LossOptions, device: str,
                    tokens: int = 1) -> LossBackend:
    """Look ``name`` up in the registry and check it can train ``config`` on ``device``.

    Raises ``ValueError`` for an unknown name and :class:`BackendUnavailable` for a known
    back-end that is not installed or does not support the device or an option in use.
    """
    backend: Backend = get_backend(name)
    info = backend.info()
    if not info.available:
        raise BackendUnavailable(f"{name}: {info.reason}")
    spec = CellSpec(backend=name, tokens=tokens, vocab=config.vocab_size, hidden=config.hidden_size,
                    device=device, bias=config.lm_head_bias, reduction=options.reduction,
                    softcap=options.softcap)
    why = backend.unsupported(spec)
    if why:
        raise BackendUnavailable(why)
    return LossBackend(name, backend.make(), info.version or "unknown")


@dataclass
class ResolvedStepLoss:
    """A back-end as a training step uses it: ``step_loss`` (naive / hidden / patched, see
    :class:`~fusedce_profiler.instrument.step.step.StepLoss`), the package version, and ``prepare(built)``,
    which applies any patch to the built model and returns what the back-end replaced."""

    name: str
    step_loss: object
    version: str
    prepare: Callable[[object], list[Replacement]]


def resolve_step_loss(name: str, config: ModelConfig, options: LossOptions, device: str,
                      tokens: int = 1) -> ResolvedStepLoss:
    """:func:`resolve_backend` for a whole training step.

    ``torch`` is the naive path (the model's own head, then ``F.cross_entropy``);
    ``liger-patched`` patches the model (:func:`~fusedce_profiler.instrument.step.patching.apply_liger_patch`);
    every other back-end computes the loss from the head's input.
    """
    from fusedce_profiler.instrument.step.patching import apply_liger_patch, replaced_by
    from fusedce_profiler.instrument.step.step import StepLoss

    backend = get_model_backend(name)
    if getattr(backend, "patches_model", False):
        info = backend.info()
        if not info.available:
            raise BackendUnavailable(f"{name}: {info.reason}")
        if device not in backend.devices:
            raise BackendUnavailable(f"{name} runs on {', '.join(backend.devices)} only, not {device}")

        def prepare(built):
            try:
                return apply_liger_patch(built)
            except ValueError as exc:
                raise BackendUnavailable(f"{name}: {exc}") from None

        return ResolvedStepLoss(name, StepLoss("patched"), info.version or "unknown", prepare)
    resolved = resolve_backend(name, config, options, device, tokens)
    kind = "naive" if name == "torch" else "hidden"
    return ResolvedStepLoss(name, StepLoss(kind, resolved.fn), resolved.version, lambda built: replaced_by(name))


def unrounded_logits_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                          bias: torch.Tensor | None = None, **options) -> torch.Tensor:
    """Eager torch's loss with the logits left unrounded: a control back-end for ``parity``.

    Under bf16 autocast, torch rounds the (N, V) logits to bf16 before the cross-entropy
    upcasts them, while a fused loss keeps its fp32 accumulators. Here the operands are
    rounded to the autocast dtype exactly as autocast would, then multiplied in fp32, so the
    logits are the GEMM's fp32 accumulations of the same bf16 products (bf16 values are exact
    in TF32 as well, so the matmul-precision setting does not matter) — what fusedce computes
    on CUDA, where its products write fp32 directly: this differs from torch by the logits'
    bf16 rounding alone. Its loss curve's gap to torch's is what a
    rounding-sized difference grows to over the run (outside autocast it *is* torch's loss).
    Use as ``--backend fusedce_profiler.instrument.step.losses:unrounded_logits_loss``.
    """
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype).float(), weight.to(dtype).float()
        bias = bias.to(dtype).float() if bias is not None else None
    with torch.autocast(device_type, enabled=False):
        return torch_loss(hidden, weight, target, bias, LossOptions(**options))
