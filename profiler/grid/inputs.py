"""The deterministic inputs of a grid cell.

Public API: :class:`CellInputs`, :func:`make_inputs`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.precision import precision
from fusedce_profiler.instrument.records import CellSpec


@dataclass
class CellInputs:
    """hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None; leaves with grads."""

    hidden: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None

    def leaves(self) -> list[torch.Tensor]:
        return [t for t in (self.hidden, self.weight, self.bias) if t is not None]

    def grads(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(grad hidden, grad weight, grad bias) as they are now."""
        return (self.hidden.grad, self.weight.grad, self.bias.grad if self.bias is not None else None)

    def clear_grads(self) -> None:
        for t in self.leaves():
            t.grad = None


def make_inputs(spec: CellSpec) -> CellInputs:
    """Seeded inputs of a cell, on ``spec.device``, in the dtypes of ``spec.mode``.

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
