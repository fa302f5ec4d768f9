"""Parity tolerances per precision mode: when a back-end's answer counts as wrong.

A cell passes when every relative error it reports (``‖x − x_ref‖ / ‖x_ref‖`` against the
fp32 reference, for the loss and each gradient) is at most the tolerance of its mode.

The tolerances are a few machine epsilons of the dtype the logits are computed in, since
that rounding is what every correct implementation pays:

- ``amp-bf16`` and ``bf16``: bf16 has ε = 2⁻⁷ ≈ 7.8e-3. Rounding the logits and the
  gradients once each gives errors of about ε/2 in the norm (eager torch measures 2–3e-3 on
  an H200). Tolerance **3e-2** (4 ε): accepts any implementation that rounds once or
  twice more than torch, rejects one that drops a term, mis-scales a gradient or filters
  gradients away wholesale (those errors are of order 1).
- ``amp-fp16``: fp16 has ε = 2⁻¹⁰ ≈ 9.8e-4. Tolerance **4e-3** (4 ε).
- ``fp32``: no low-precision rounding at all; what remains is summation order over H and
  V (√H·ε₃₂ ≈ 1e-5 at H = 4096) and TF32 if a back-end enables it (ε = 2⁻¹⁰). Tolerance
  **2e-3**, which admits TF32 matrix products but nothing coarser.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fusedce_profiler.instrument.records import CellResult

TOLERANCES: dict[str, float] = {
    "amp-bf16": 3e-2,
    "bf16": 3e-2,
    "amp-fp16": 4e-3,
    "fp32": 2e-3,
}


@dataclass(frozen=True)
class ParityVerdict:
    """The worst relative error of one cell against its mode's tolerance.

    ``worst`` is ``None`` when the cell reports no error at all (e.g. it ran out of memory);
    ``passed`` is then ``None`` too: no evidence either way.
    """

    worst: float | None
    worst_name: str | None
    tolerance: float
    passed: bool | None


def tolerance_for(mode: str) -> float:
    """The relative-error tolerance of a precision mode (see the module docstring)."""
    try:
        return TOLERANCES[mode]
    except KeyError:
        raise ValueError(f"mode: unknown precision mode {mode!r}; known: {', '.join(TOLERANCES)}") from None


def parity_verdict(result: CellResult) -> ParityVerdict:
    """Compare the largest reported relative error of ``result`` with its mode's tolerance."""
    tolerance = tolerance_for(result.spec.mode)
    errors = {
        name: value
        for name, value in vars(result.parity).items()
        if value is not None
    }
    if result.status != "ok" or not errors:
        return ParityVerdict(None, None, tolerance, None)
    nan_names = [name for name, value in errors.items() if math.isnan(value)]
    worst_name = nan_names[0] if nan_names else max(errors, key=lambda name: errors[name])
    worst = errors[worst_name]
    passed = bool(worst <= tolerance)  # False for NaN: a NaN error is a failure
    return ParityVerdict(worst, worst_name, tolerance, passed)
