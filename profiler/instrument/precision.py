"""Precision modes: the dtypes an LM head is held in and the autocast its forward runs under.

==========  ============  ============  =======================
mode        hidden        weight/bias   forward runs under
==========  ============  ============  =======================
amp-bf16    bf16          fp32          autocast(bfloat16)
amp-fp16    fp16          fp32          autocast(float16)
bf16        bf16          bf16          no autocast
fp32        fp32          fp32          no autocast
==========  ============  ============  =======================

``amp-bf16`` is how PyTorch Lightning's ``precision="bf16-mixed"`` trains: fp32 master
weights, bf16 matrix products. Grid cells use every mode; a whole training step (model
mode) uses ``amp-bf16``, ``bf16`` or ``fp32``.

Lightning's precision names are accepted as aliases wherever a mode is taken
(:func:`canonical_mode`): ``bf16-mixed`` is ``amp-bf16``, ``16-mixed`` is ``amp-fp16``,
``bf16-true`` is ``bf16``, ``32-true`` and ``32`` are ``fp32``.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

MODES = ("amp-bf16", "amp-fp16", "bf16", "fp32")
TRAINING_MODES = ("amp-bf16", "bf16", "fp32")
MODE_WORDS = {"amp-bf16": "fp32 master weights under bf16 autocast",
              "amp-fp16": "fp32 master weights under fp16 autocast",
              "bf16": "bf16 weights and activations (no autocast)", "fp32": "fp32 throughout (no autocast)"}
"""Each mode as a report says how a step ran."""
LIGHTNING_ALIASES = {"bf16-mixed": "amp-bf16", "16-mixed": "amp-fp16", "bf16-true": "bf16",
                     "32-true": "fp32", "32": "fp32"}


@dataclass(frozen=True)
class Precision:
    """Dtypes of one mode; ``autocast`` is the autocast dtype or ``None``."""

    hidden: torch.dtype
    weight: torch.dtype
    autocast: torch.dtype | None

    @property
    def compute(self) -> torch.dtype:
        """The dtype the logits GEMM runs in."""
        return self.autocast or self.weight


@functools.cache
def _precisions() -> dict[str, Precision]:
    """Each mode's dtypes (torch imported here: the names above serve a command's parsing without it)."""
    import torch

    return {"amp-bf16": Precision(torch.bfloat16, torch.float32, torch.bfloat16),
            "amp-fp16": Precision(torch.float16, torch.float32, torch.float16),
            "bf16": Precision(torch.bfloat16, torch.bfloat16, None),
            "fp32": Precision(torch.float32, torch.float32, None)}


def precision(mode: str) -> Precision:
    """The :class:`Precision` of ``mode``; ``ValueError`` naming the known modes otherwise."""
    return _precisions()[canonical_mode(mode)]


def canonical_mode(name: str, allowed: tuple[str, ...] = MODES, what: str = "mode") -> str:
    """The mode ``name`` means: itself, or the mode a Lightning precision name stands for.

    Raises ``ValueError`` in one line naming ``what`` (the argument), the valid names and
    the Lightning aliases among them; a Lightning name whose mode is not in ``allowed``
    (``16-mixed`` where only training modes run) says which mode it stands for.
    """
    mode = LIGHTNING_ALIASES.get(name, name)
    if mode in allowed:
        return mode
    aliases = ", ".join(f"{alias} = {target}" for alias, target in LIGHTNING_ALIASES.items() if target in allowed)
    valid = f"choose one of {', '.join(allowed)} (Lightning's names: {aliases})"
    if name in LIGHTNING_ALIASES:
        raise ValueError(f"{what} {name!r} is Lightning's name for {mode}, which is not available here; {valid}")
    raise ValueError(f"{what} {name!r} is unknown; {valid}")


def autocast(mode: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The autocast context a forward of ``mode`` runs in on ``device`` (a no-op outside amp)."""
    import torch

    dtype = precision(mode).autocast
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    import torch

    return torch.empty((), dtype=dtype).element_size()
