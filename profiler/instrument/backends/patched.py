"""Back-ends of the model mode only: they change the model, not just the loss."""
from __future__ import annotations

from dataclasses import dataclass

from fusedce_profiler.instrument.backends.base import Backend, LossFn
from fusedce_profiler.instrument.backends.third_party import liger_version


class LigerPatchedBackend(Backend):
    """Liger-Kernel's whole-model patching of a Hugging Face model:
    ``liger_kernel.transformers.apply_liger_kernel_to_<model_type>(model=...)`` with the fused
    linear cross-entropy on, which also swaps RMSNorm, the SwiGLU/GeGLU MLP and RoPE for
    Liger's kernels. Not a loss function: the training step calls the patched model with
    labels (:mod:`fusedce_profiler.instrument.step.patching`); model mode only."""

    name = "liger-patched"
    description = "liger_kernel.transformers.apply_liger_kernel_to_<arch>(model=...): norms, MLP, RoPE and the loss"
    devices = ("cuda",)
    options = ("ignore_index", "softcap")
    patches_model = True

    def version(self) -> str:
        return liger_version()

    def make(self) -> LossFn:
        raise TypeError("liger-patched patches a model; it has no loss function of its own")


@dataclass(frozen=True)
class Replacement:
    """What a back-end replaced in the model: ``group`` is one of
    :data:`fusedce_profiler.instrument.tracing.attribution.GROUPS` ("LM-head/loss", "norms", "MLP", "attention", ...),
    ``what`` names it (``LlamaRMSNorm.forward``), ``count`` how many modules."""

    group: str
    what: str
    count: int = 1
