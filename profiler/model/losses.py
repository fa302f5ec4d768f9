"""The profiler's loss back-ends, as the model mode calls them.

A back-end is ``(hidden, weight, target, bias, options) -> loss`` (see
:mod:`profiler.backends`): here ``hidden`` is the model's (B·T, H) final hidden states,
``weight`` the LM head's (V, H) parameter itself (the embedding when tied), ``target`` the
(B·T,) next tokens. :func:`resolve_backend` adds what a training run needs on top of the
registry: a clear "cannot run here" (:class:`BackendUnavailable`, reported as ``skipped``)
before any model is built.
"""
from __future__ import annotations

from dataclasses import dataclass

from profiler.backends import Backend, LossFn, LossOptions, get_backend
from profiler.configs import ModelConfig
from profiler.records import CellSpec


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
