"""Shape, dtype and device checks of the tensors passed to the loss.

Every check raises a Python exception that names the argument and what was expected, so
bad input never reaches a kernel (where it would become a device-side assert, a hang or a
silent wrong answer).

Target range check. Targets outside ``[0, V)`` that are not ``ignore_index`` are found
with one reduction over the N targets. On CPU tensors the result is read at once and an
``IndexError`` is raised. On CUDA tensors reading it would be a host synchronisation in
the training hot path, so by default it is not read: instead the loss of such a token is
NaN (and so is its gradient), which no optimiser step can miss. Pass
``validate_targets=True`` to get the ``IndexError`` on CUDA too (one sync per call).
"""
from __future__ import annotations

import torch

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_tensors(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
) -> None:
    """Check types, shapes, dtypes and devices; raise TypeError/ValueError naming the argument."""
    _check_types(hidden, weight, target, bias)
    _check_dtypes(hidden, weight, target, bias)
    _check_shapes(hidden, weight, target, bias)
    _check_devices(hidden, weight, target, bias)


def _check_types(hidden, weight, target, bias) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")


def _check_dtypes(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None) -> None:
    if hidden.dtype not in FLOATING:
        raise TypeError(f"hidden must be a floating tensor (float16/bfloat16/float32/float64), got {hidden.dtype}")
    if weight.dtype not in FLOATING:
        raise TypeError(f"weight must be a floating tensor, got {weight.dtype}")
    if bias is not None and bias.dtype not in FLOATING:
        raise TypeError(f"bias must be a floating tensor, got {bias.dtype}")
    if target.dtype not in INTEGER:
        raise TypeError(f"target must be an integer tensor of class indices (e.g. torch.int64), got {target.dtype}")


def _check_shapes(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None) -> None:
    """hidden (..., H), weight (V, H) with V ≥ 1, target hidden.shape[:-1], bias (V,)."""
    if hidden.dim() < 1:
        raise ValueError(f"hidden must have shape (..., H), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D with shape (V, H), got shape {tuple(weight.shape)}")
    vocab, h = weight.shape
    if hidden.shape[-1] != h:
        raise ValueError(
            f"hidden's last dimension must equal weight's H: hidden has shape {tuple(hidden.shape)}, "
            f"weight has shape {tuple(weight.shape)} (expected hidden (..., {h}))"
        )
    if vocab < 1:
        raise ValueError(f"weight must have at least one row (V >= 1), got shape {tuple(weight.shape)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"target must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, got {tuple(target.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias must have shape (V,) = ({vocab},), got {tuple(bias.shape)}")


def _check_devices(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None) -> None:
    devices = {("hidden", hidden.device), ("weight", weight.device), ("target", target.device)}
    if bias is not None:
        devices.add(("bias", bias.device))
    if len({d for _, d in devices}) > 1:
        listed = ", ".join(f"{n} on {d}" for n, d in sorted(devices, key=lambda x: x[0]))
        raise ValueError(f"hidden, weight, target and bias must be on one device, got {listed}")


def outside_vocabulary(target: torch.Tensor, vocab: int) -> torch.Tensor:
    """Boolean (N,) mask of targets outside [0, V), ``ignore_index`` included (no sync)."""
    return (target < 0) | (target >= vocab)


def out_of_range_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> torch.Tensor:
    """Boolean (N,) mask of targets outside [0, V) that are not ``ignore_index`` (no sync)."""
    return outside_vocabulary(target, vocab) & (target != ignore_index)


def raise_on_out_of_range_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raise IndexError if any target is outside [0, V) and not ``ignore_index`` (reads one bool)."""
    bad = out_of_range_targets(target, vocab, ignore_index)
    if target.numel() and bool(bad.any()):
        first = int(target[bad].reshape(-1)[0])
        raise IndexError(
            f"target values must be in [0, {vocab}) or equal ignore_index={ignore_index}; "
            f"found {int(bad.sum())} out-of-range value(s), e.g. {first}"
        )
