"""The dtypes of each precision mode and the deterministic inputs of a cell.

Modes (as a training loop would hold its LM head):

==========  ============  ============  =======================
mode        hidden        weight/bias   forward runs under
==========  ============  ============  =======================
amp-bf16    bf16          fp32          autocast(bfloat16)
amp-fp16    fp16          fp32          autocast(float16)
bf16        bf16          bf16          no autocast
fp32        fp32          fp32          no autocast
==========  ============  ============  =======================
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from profiler.backends import IGNORE_INDEX
from profiler.records import MODES, CellSpec


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


PRECISIONS: dict[str, Precision] = {
    "amp-bf16": Precision(torch.bfloat16, torch.float32, torch.bfloat16),
    "amp-fp16": Precision(torch.float16, torch.float32, torch.float16),
    "bf16": Precision(torch.bfloat16, torch.bfloat16, None),
    "fp32": Precision(torch.float32, torch.float32, None),
}
assert set(PRECISIONS) == set(MODES)


def precision(mode: str) -> Precision:
    if mode not in PRECISIONS:
        raise ValueError(f"mode {mode!r} is unknown; choose one of {', '.join(PRECISIONS)}")
    return PRECISIONS[mode]


def autocast_for(spec: CellSpec) -> contextlib.AbstractContextManager:
    """The autocast context the cell's forward runs in (a no-op outside amp modes)."""
    dtype = precision(spec.mode).autocast
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(spec.device.split(":")[0], dtype=dtype)


@dataclass
class CellInputs:
    """hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None; leaves with grads."""

    hidden: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None

    def leaves(self) -> list[torch.Tensor]:
        return [t for t in (self.hidden, self.weight, self.bias) if t is not None]

    def clear_grads(self) -> None:
        for t in self.leaves():
            t.grad = None


def make_inputs(spec: CellSpec) -> CellInputs:
    """Seeded inputs of a cell, on ``spec.device``.

    hidden ~ N(0, 1), weight ~ N(0, 1/H) (logits of unit scale, like a trained head),
    bias ~ N(0, 0.1²); targets uniform in [0, V) with a fraction ``ignore_frac`` of rows
    (chosen at random) set to the ignore index.
    """
    prec = precision(spec.mode)
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    n, h, v = spec.tokens, spec.hidden, spec.vocab
    device = torch.device(spec.device)

    def randn(*shape, scale=1.0, dtype):
        # Drawn on the device (no N·H host copy), from a seed drawn on the CPU generator.
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        dev_gen = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(*shape, generator=dev_gen, device=device, dtype=dtype).mul_(scale)

    hidden = randn(n, h, dtype=prec.hidden).requires_grad_()
    weight = randn(v, h, scale=h ** -0.5, dtype=prec.weight).requires_grad_()
    bias = randn(v, scale=0.1, dtype=prec.weight).requires_grad_() if spec.bias else None
    target = torch.randint(0, v, (n,), generator=gen).to(device)
    if spec.ignore_frac:
        ignored = torch.rand(n, generator=gen) < spec.ignore_frac
        target[ignored.to(device)] = IGNORE_INDEX
    return CellInputs(hidden, weight, target, bias)
