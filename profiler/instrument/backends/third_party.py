"""The optional third-party losses: liger-kernel's and Apple's cut-cross-entropy.

Neither package is imported at module level: :meth:`~fusedce_profiler.instrument.backends.base.Backend.version`
looks for it without importing it, and the options each honours are read from its
signatures at run time.
"""
from __future__ import annotations

import inspect

import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends.base import Backend, LossFn, dist_version, require


def liger_version() -> str:
    """The installed liger-kernel's version; raises ``ImportError`` when it is missing."""
    require("liger_kernel")
    return dist_version("liger-kernel", "liger_kernel") or "unknown"


class LigerBackend(Backend):
    """liger-kernel's ``LigerFusedLinearCrossEntropyLoss``, called weight-first:
    ``loss_fn(weight, hidden, target, bias)``. Options are read from its constructor's
    signature at run time (``lse_square_scale`` is its z-loss)."""

    name = "liger"
    description = "liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss"
    devices = ("cuda",)
    _KWARGS = {"ignore_index": "ignore_index", "label_smoothing": "label_smoothing",
               "z_loss": "lse_square_scale", "softcap": "softcap", "reduction": "reduction"}

    def version(self) -> str:
        return liger_version()

    @property
    def options(self) -> tuple[str, ...]:  # type: ignore[override]
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError:
            return ()
        params = inspect.signature(LigerFusedLinearCrossEntropyLoss.__init__).parameters
        opts = ["bias", "reduction=sum"]
        opts += [ours for ours, theirs in self._KWARGS.items() if ours != "reduction" and theirs in params]
        return tuple(opts)

    def make(self) -> LossFn:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        params = inspect.signature(LigerFusedLinearCrossEntropyLoss.__init__).parameters
        cache: dict[LossOptions, torch.nn.Module] = {}

        def loss(hidden, weight, target, bias, options: LossOptions):
            if options not in cache:
                kwargs = {theirs: getattr(options, ours) for ours, theirs in self._KWARGS.items()
                          if theirs in params}
                cache[options] = LigerFusedLinearCrossEntropyLoss(**kwargs)
            return cache[options](weight, hidden, target, bias)

        return loss


class CceBackend(Backend):
    """Apple's cut-cross-entropy ``linear_cross_entropy(e, c, targets, ...)`` with its
    default implementation (gradient filtering on, as shipped). ``bias`` and
    ``label_smoothing`` count as supported only if its signature has them (25.1.1 has not)."""

    name = "cce"
    description = "cut_cross_entropy.linear_cross_entropy (default impl)"
    devices = ("cuda",)

    def version(self) -> str:
        require("cut_cross_entropy")
        return dist_version("cut-cross-entropy", "cut_cross_entropy") or "unknown"

    @property
    def options(self) -> tuple[str, ...]:  # type: ignore[override]
        try:
            from cut_cross_entropy import linear_cross_entropy
        except ImportError:
            return ()
        params = inspect.signature(linear_cross_entropy).parameters
        opts = ["ignore_index", "reduction=sum", "reduction=none"]
        opts += [name for name in ("bias", "softcap", "label_smoothing") if name in params]
        return tuple(opts)

    def make(self) -> LossFn:
        from cut_cross_entropy import linear_cross_entropy

        params = inspect.signature(linear_cross_entropy).parameters

        def loss(hidden, weight, target, bias, options: LossOptions):
            kwargs = {"ignore_index": options.ignore_index, "softcap": options.softcap,
                      "reduction": options.reduction}
            if bias is not None:
                kwargs["bias"] = bias
            if options.label_smoothing and "label_smoothing" in params:
                kwargs["label_smoothing"] = options.label_smoothing
            return linear_cross_entropy(hidden, weight, target, **kwargs)

        return loss
