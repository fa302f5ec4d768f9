"""``--preset`` / ``--config``: the LM head (H, V, soft-cap) of a model, for a grid."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fusedce_profiler.instrument.models.configs import ModelConfig, get_preset, load_config


@dataclass(frozen=True)
class Head:
    """The loss-relevant shape of a model: hidden size H, vocabulary V, logit soft-cap."""

    hidden: int
    vocab: int
    softcap: float | None
    name: str


def head_from(preset: str | None, config: Path | None) -> Head | None:
    """The head of ``--preset NAME`` or ``--config PATH`` (``None`` if neither is given).

    Raises ``ValueError`` (exit code 2) for an unknown preset, an unreadable or invalid
    config file, or both options at once.
    """
    if preset and config:
        raise ValueError("--preset and --config both name a model: give one of them")
    if not preset and not config:
        return None
    model: ModelConfig = get_preset(preset) if preset else load_config(config)
    return Head(model.hidden_size, model.vocab_size, model.final_logit_softcapping, model.name)
