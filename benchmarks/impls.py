"""The LM-head losses measured side by side, behind one calling convention.

Each :class:`Impl` turns a :class:`~profiler.records.CellSpec` into a ``step(inputs) -> loss``
callable (a 0-d tensor, mean over non-ignored tokens) that the measurement runs under
autocast in amp mode and differentiates with ``loss.backward()``. An implementation that
cannot run a cell says why (:meth:`Impl.unsupported`) instead of failing: optional back-ends
are imported only when used and reported as "not installed" when missing.

- ``torch``: ``F.cross_entropy(F.linear(h, W, b), y)`` eager, as a user writes it;
- ``torch_compile``: the same function under ``torch.compile(dynamic=False)``;
- ``liger``: liger-kernel's ``LigerFusedLinearCrossEntropyLoss``;
- ``cce``: cut-cross-entropy's ``linear_cross_entropy`` (its defaults: gradient filtering on);
- ``fusedce``: ``fusedce.linear_cross_entropy`` (``impl="auto"``).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from profiler.inputs import CellInputs
from profiler.records import CellSpec

Step = Callable[[CellInputs], torch.Tensor]


def eager_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
               bias: torch.Tensor | None, *, ignore_index: int, label_smoothing: float,
               z_loss: float, softcap: float | None) -> torch.Tensor:
    """Mean loss the way a user writes it in PyTorch; soft-cap and z-loss only when asked."""
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing)
    if z_loss:
        valid = target != ignore_index
        lse = torch.logsumexp(logits.float(), dim=-1)
        loss = loss + z_loss * (lse.square() * valid).sum() / valid.sum()
    return loss


def _loss_kwargs(spec: CellSpec) -> dict:
    options = spec.options()
    return {key: options[key] for key in ("ignore_index", "label_smoothing", "z_loss", "softcap")}


def _check_mean(spec: CellSpec) -> None:
    if spec.reduction != "mean":
        raise ValueError(f"the benchmark measures reduction='mean', got reduction={spec.reduction!r}")


def _torch_step(spec: CellSpec) -> Step:
    kwargs = _loss_kwargs(spec)
    return lambda x: eager_loss(x.hidden, x.weight, x.target, x.bias, **kwargs)


def _torch_compile_step(spec: CellSpec) -> Step:
    kwargs = _loss_kwargs(spec)

    def loss(hidden, weight, target, bias):
        return eager_loss(hidden, weight, target, bias, **kwargs)

    # A fresh Dynamo cache per cell: every (row, mode) is a new static-shape graph of the same
    # code object, and past Dynamo's per-code recompile limit (8, reached by the default run's
    # 8 cells) it would silently run eagerly. The compile lands in the cell's warm-up.
    torch._dynamo.reset()
    compiled = torch.compile(loss, dynamic=False)
    return lambda x: compiled(x.hidden, x.weight, x.target, x.bias)


def _liger_step(spec: CellSpec) -> Step:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    kwargs = _loss_kwargs(spec)
    module = LigerFusedLinearCrossEntropyLoss(
        ignore_index=kwargs["ignore_index"], lse_square_scale=kwargs["z_loss"],
        label_smoothing=kwargs["label_smoothing"], reduction="mean", softcap=kwargs["softcap"])
    return lambda x: module(x.weight, x.hidden, x.target, x.bias)


def _cce_step(spec: CellSpec) -> Step:
    from cut_cross_entropy import linear_cross_entropy

    kwargs = _loss_kwargs(spec)
    return lambda x: linear_cross_entropy(x.hidden, x.weight, x.target, ignore_index=kwargs["ignore_index"],
                                          softcap=kwargs["softcap"], reduction="mean")


def _fusedce_step(spec: CellSpec) -> Step:
    import fusedce

    options = spec.options()
    return lambda x: fusedce.linear_cross_entropy(x.hidden, x.weight, x.target, x.bias, **options)


def _cce_unsupported_options(spec: CellSpec) -> str | None:
    missing = [name for name, on in (("bias", spec.bias), ("label smoothing", spec.label_smoothing),
                                     ("z-loss", spec.z_loss)) if on]
    return f"no {', '.join(missing)} in cut-cross-entropy 25.1.1" if missing else None


def _triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _torch_version() -> str:
    return torch.__version__


def _fusedce_version() -> str:
    try:
        import fusedce
    except ImportError:  # the cell's step reports it as an error
        return ""
    return getattr(fusedce, "__version__", "")


def _distribution_version(distribution: str) -> Callable[[], str]:
    def version() -> str:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return ""
    return version


@dataclass(frozen=True)
class Impl:
    """One loss implementation: how to build its step, where it runs, what it needs.

    ``module``: the import name of an optional back-end (None: always there), installed as
    ``distribution``. ``cpu``: "yes", "interpreter" (only under ``TRITON_INTERPRET=1``) or
    "no". ``unsupported_options``: the reason a cell's options cannot be run, or None.
    """

    name: str
    build: Callable[[CellSpec], Step]
    version: Callable[[], str]
    module: str | None = None
    distribution: str | None = None
    cpu: str = "yes"
    unsupported_options: Callable[[CellSpec], str | None] = lambda spec: None

    def installed(self) -> bool:
        return self.module is None or importlib.util.find_spec(self.module) is not None

    def unsupported(self, spec: CellSpec) -> str | None:
        """Why this implementation cannot run ``spec`` (a "skipped" reason), or None."""
        if spec.device == "cpu" and self.cpu == "no":
            return "needs CUDA"
        if spec.device == "cpu" and self.cpu == "interpreter" and not _triton_interpreter_on():
            return "needs CUDA (or TRITON_INTERPRET=1)"
        if not self.installed():
            return f"{self.distribution} not installed"
        return self.unsupported_options(spec)

    def step(self, spec: CellSpec) -> Step:
        _check_mean(spec)
        return self.build(spec)


IMPLS = {
    impl.name: impl
    for impl in (
        Impl("torch", _torch_step, _torch_version),
        Impl("torch_compile", _torch_compile_step, _torch_version),
        Impl("liger", _liger_step, _distribution_version("liger-kernel"), module="liger_kernel",
             distribution="liger-kernel", cpu="interpreter"),
        Impl("cce", _cce_step, _distribution_version("cut-cross-entropy"), module="cut_cross_entropy",
             distribution="cut-cross-entropy", cpu="no", unsupported_options=_cce_unsupported_options),
        Impl("fusedce", _fusedce_step, _fusedce_version),
    )
}
