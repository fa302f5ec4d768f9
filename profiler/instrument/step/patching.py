"""Back-ends that patch more than the loss, and the record of what each one replaced.

:func:`apply_liger_patch` calls ``liger_kernel.transformers.apply_liger_kernel_to_<model_type>``
on a built Hugging Face model (``model=`` the instance, the fused linear cross-entropy on,
the plain cross-entropy off) and returns the :class:`~fusedce_profiler.instrument.backends.Replacement` list it
*observed*: a snapshot of every module's class and ``forward``, of the model class's
``forward`` and of the modeling module's functions and classes before and after the call,
diffed and grouped as the attribution groups them (norms, MLP, attention, LM-head/loss).
:func:`replaced_by` says the same for the loss-only back-ends (the head and the loss, or
nothing for the naive ``torch``), so every result records what it changed.
"""
from __future__ import annotations

import inspect
import sys

from torch import nn

from fusedce_profiler.instrument.backends import Replacement
from fusedce_profiler.instrument.models.source import BuiltModel

LOSS_ONLY = {"torch": [], "torch-compile": [Replacement("LM-head/loss", "the loss, compiled with torch.compile")]}


def replaced_by(backend: str) -> list[Replacement]:
    """What a loss-only back-end replaces: nothing for ``torch``, else the head and the loss."""
    if backend in LOSS_ONLY:
        return list(LOSS_ONLY[backend])
    return [Replacement("LM-head/loss", f"the LM head's matmul and the cross-entropy ({backend})")]


def _group_of(module: nn.Module) -> str:
    name = type(module).__name__.lower()
    if "norm" in name:
        return "norms"
    if "mlp" in name or "feedforward" in name:
        return "MLP"
    if "attention" in name or "attn" in name or "rotary" in name:
        return "attention"
    if "embedding" in name:
        return "embedding"
    return "other"


def _forward_of(module: nn.Module):
    own = module.__dict__.get("forward")
    return getattr(own, "__func__", own) if own is not None else type(module).forward


def _snapshot(model: nn.Module) -> dict:
    modeling = sys.modules.get(type(model).__module__)
    names = {}
    if modeling is not None:
        names = {k: v for k, v in vars(modeling).items() if callable(v) and not k.startswith("__")}
    return {
        "modules": {name: (type(m), _forward_of(m)) for name, m in model.named_modules() if name},
        "model_forward": _forward_of(model),
        "modeling": names,
    }


def _diff(before: dict, after: dict, model: nn.Module) -> list[Replacement]:
    counts: dict[tuple[str, str], int] = {}
    modules = dict(model.named_modules())
    for name, (cls, forward) in before["modules"].items():
        now = after["modules"].get(name)
        if now is None or now == (cls, forward):
            continue
        group = _group_of(modules[name]) if name in modules else "other"
        if group == "other" and cls.__name__.lower().endswith("norm"):
            group = "norms"
        key = (group, f"{cls.__name__}.forward")
        counts[key] = counts.get(key, 0) + 1
    out = [Replacement(group, what, n) for (group, what), n in sorted(counts.items())]
    if after["model_forward"] is not before["model_forward"]:
        out.append(Replacement("LM-head/loss", f"{type(model).__name__}.forward (the LM head and the loss, fused)"))
    for key, value in after["modeling"].items():
        if before["modeling"].get(key) is value:
            continue
        low = key.lower()
        group = ("attention" if "rotary" in low or "rope" in low else "norms" if "norm" in low else
                 "MLP" if "mlp" in low else "LM-head/loss" if "loss" in low or "entropy" in low else "other")
        out.append(Replacement(group, f"{type(model).__module__.split('.')[-1]}.{key}"))
    return out


def apply_liger_patch(built: BuiltModel) -> list[Replacement]:
    """Patch ``built.module`` with Liger's whole-model patch for its ``model_type``.

    Raises ``ValueError`` when the model is not a Hugging Face one or Liger has no patch for
    its family, ``ImportError`` when liger-kernel is missing.
    """
    if built.kind != "hf" or not built.model_type:
        raise ValueError("liger-patched patches Hugging Face models only (use --hf)")
    from liger_kernel import transformers as liger

    fn = getattr(liger, f"apply_liger_kernel_to_{built.model_type}", None)
    if fn is None:
        raise ValueError(f"liger-kernel has no apply_liger_kernel_to_{built.model_type}")
    params = inspect.signature(fn).parameters
    wanted = {"model": built.module, "fused_linear_cross_entropy": True, "cross_entropy": False}
    kwargs = {k: v for k, v in wanted.items() if k in params}
    before = _snapshot(built.module)
    fn(**kwargs)
    return _diff(before, _snapshot(built.module), built.module)
