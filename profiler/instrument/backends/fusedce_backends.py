"""This project's loss at three points of its time–memory frontier.

``fusedce``, ``fusedce-min`` and ``fusedce-fast`` pass ``memory_budget`` as its default,
``"min"`` and ``"fast"``; :class:`FusedceBackend` made with a name and knobs is a point of
its own.
"""
from __future__ import annotations

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends.base import Backend, LossFn, dist_version, require


class FusedceBackend(Backend):
    """``fusedce.linear_cross_entropy`` at one point of its time–memory frontier.

    ``knobs`` are its keyword arguments ``memory_budget``, ``strategy`` and
    ``grad_weight_accumulation``, passed as given (none: the default plan). An instance made
    with ``name`` and knobs is a point of its own (the benchmarks' strategy variants)."""

    name = "fusedce"
    description = "fusedce.linear_cross_entropy (this project)"
    knobs: dict = {}
    cpu_first_step_is_warm = True  # plain PyTorch ops on the CPU; on a GPU its Triton kernels compile and autotune

    def __init__(self, name: str | None = None, **knobs) -> None:
        if name is not None:
            self.name = name
            self.description = "fusedce.linear_cross_entropy(" + ", ".join(
                f"{key}={value!r}" for key, value in knobs.items()) + ")"
        self.knobs = {**type(self).knobs, **knobs}

    def version(self) -> str:
        require("fusedce")
        import fusedce

        return dist_version("fusedce") or fusedce.__version__

    def make(self) -> LossFn:
        import fusedce

        knobs = dict(self.knobs)

        def loss(hidden, weight, target, bias, options: LossOptions):
            return fusedce.linear_cross_entropy(
                hidden, weight, target, bias, ignore_index=options.ignore_index, reduction=options.reduction,
                label_smoothing=options.label_smoothing, z_loss=options.z_loss, softcap=options.softcap,
                **knobs)

        return loss


class FusedceMinBackend(FusedceBackend):
    """fusedce's lowest-memory point: ``memory_budget="min"`` (the smallest blocks)."""

    name = "fusedce-min"
    description = "fusedce.linear_cross_entropy, memory_budget='min' (lowest memory)"
    knobs = {"memory_budget": "min"}


class FusedceFastBackend(FusedceBackend):
    """fusedce's fastest point: ``memory_budget="fast"`` (gradients computed in forward
    where they fit, about torch.compile's memory)."""

    name = "fusedce-fast"
    description = "fusedce.linear_cross_entropy, memory_budget='fast' (gradients in forward)"
    knobs = {"memory_budget": "fast"}
