"""The PyTorch back-ends: the eager loss as users write it, under ``torch.compile``, and
PyTorch's own chunked ``F.linear_cross_entropy``."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends.base import Backend, LossFn


def torch_loss(hidden, weight, target, bias, options: LossOptions) -> torch.Tensor:
    """The loss as users write it in eager PyTorch; also the formula of the fp32 reference.

    logits = hidden @ weight.T + bias; with ``softcap`` c: logits = c·tanh(logits / c).
    Per row i with t_i != ignore_index: ℓ_i = CE(logits_i, t_i; label_smoothing)
    + z_loss · logsumexp(logits_i)²; ignored rows contribute 0. "mean" divides the sum
    by the number of non-ignored rows (PyTorch's convention).
    """
    logits = F.linear(hidden, weight, bias)
    if options.softcap is not None:
        logits = options.softcap * torch.tanh(logits / options.softcap)
    if not options.z_loss:
        return F.cross_entropy(logits, target, ignore_index=options.ignore_index,
                               reduction=options.reduction, label_smoothing=options.label_smoothing)
    per_row = F.cross_entropy(logits, target, ignore_index=options.ignore_index,
                              reduction="none", label_smoothing=options.label_smoothing)
    valid = target != options.ignore_index
    per_row = per_row + options.z_loss * torch.logsumexp(logits.float(), dim=-1).square() * valid
    if options.reduction == "none":
        return per_row
    if options.reduction == "sum":
        return per_row.sum()
    return per_row.sum() / valid.sum()


class TorchBackend(Backend):
    name = "torch"
    description = "eager F.cross_entropy(F.linear(h, W, b), y), as users write it"
    cpu_first_step_is_warm = True  # eager ops

    def make(self) -> LossFn:
        return torch_loss


class TorchCompileBackend(Backend):
    name = "torch-compile"
    description = "the eager torch loss under torch.compile (dynamic=False)"

    def make(self) -> LossFn:
        # Forget earlier cells' graphs: their guards would count against dynamo's
        # recompile limit, past which it silently falls back to eager.
        torch._dynamo.reset()
        return torch.compile(torch_loss, dynamic=False)


class TorchNativeBackend(Backend):
    name = "torch-native"
    description = "torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions() (chunked)"
    # With label smoothing it warns and falls back to its unchunked reference path: that
    # would be measured under this name, so such cells are skipped instead.
    options = ("bias", "ignore_index", "reduction=sum", "reduction=none")

    def version(self) -> str:
        if not hasattr(F, "linear_cross_entropy") or not hasattr(torch.nn, "LinearCrossEntropyOptions"):
            raise ImportError(f"torch {torch.__version__} has no F.linear_cross_entropy")
        return torch.__version__

    def make(self) -> LossFn:
        self.version()
        chunked = torch.nn.LinearCrossEntropyOptions()

        def loss(hidden, weight, target, bias, options: LossOptions):
            return F.linear_cross_entropy(hidden, weight, target, linear_bias=bias, reduction=options.reduction,
                                          ignore_index=options.ignore_index, options=chunked)

        return loss
