"""The scalar options of the loss, validated once at the API boundary."""
from __future__ import annotations

import math
from dataclasses import dataclass

REDUCTIONS = ("mean", "sum", "none")
IMPLS = ("auto", "torch", "triton")
IGNORE_INDEX = -100  # the target value whose tokens are left out (PyTorch's convention)


@dataclass(frozen=True)
class LossOptions:
    """Options shared by every implementation.

    ``softcap`` is ``None`` (no capping) or a positive float ``s``: logits become
    ``s * tanh(logits / s)``. ``z_loss`` adds ``z_loss * logsumexp(logits)**2`` per token.
    """

    ignore_index: int = IGNORE_INDEX
    reduction: str = "mean"
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ignore_index, bool) or not isinstance(self.ignore_index, int):
            raise TypeError(f"ignore_index must be an int, got {type(self.ignore_index).__name__}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        _check_finite_float("label_smoothing", self.label_smoothing)
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {self.label_smoothing}")
        _check_finite_float("z_loss", self.z_loss)
        if self.z_loss < 0.0:
            raise ValueError(f"z_loss must be >= 0, got {self.z_loss}")
        if self.softcap is not None:
            _check_finite_float("softcap", self.softcap)
            if self.softcap <= 0.0:
                raise ValueError(f"softcap must be None or > 0, got {self.softcap}")

    @property
    def softcap_value(self) -> float:
        """``softcap`` as a float, 0.0 meaning "no soft-capping" (the form the kernels take)."""
        return 0.0 if self.softcap is None else float(self.softcap)


def _check_finite_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
