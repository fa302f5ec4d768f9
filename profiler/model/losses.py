"""Loss back-ends as the model mode calls them: ``(hidden, weight, target, bias, options) -> loss``.

``hidden``: (N, H) final hidden states (bf16 under autocast), ``weight``: (V, H) the LM
head's parameter (fp32 master weight), ``target``: (N,) int64 with ``ignore_index`` for
ignored positions, ``bias``: (V,) or ``None``, ``options``: the keyword options of
``fusedce.linear_cross_entropy`` (``ignore_index``, ``reduction``, ``label_smoothing``,
``z_loss``, ``softcap``). Returns a scalar (``reduction`` "mean" or "sum").

Names are those of the profiler's back-end registry (``profiler.backends``) when it is
importable; otherwise this module's own small set is used: ``torch``, ``torch-compile``,
``fusedce``, ``liger``, ``cce``. ``module:callable`` loads a user's function with the same
signature. Optional back-ends are imported only when asked for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", dict], torch.Tensor]


class BackendUnavailable(RuntimeError):
    """The back-end is known but cannot run here (not installed, no CUDA, option unsupported)."""


@dataclass(frozen=True)
class LossBackend:
    """A resolved back-end: its name, its callable and the version of the package behind it."""

    name: str
    fn: LossFn
    version: str


def default_options(*, reduction: str = "mean", ignore_index: int = -100,
                    softcap: float | None = None) -> dict[str, Any]:
    """The loss options a training step uses (no label smoothing, no z-loss)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return {"ignore_index": ignore_index, "reduction": reduction, "label_smoothing": 0.0,
            "z_loss": 0.0, "softcap": softcap}


def torch_loss(hidden, weight, target, bias, options) -> torch.Tensor:
    """Cross-entropy as users write it: full logits, then ``F.cross_entropy``."""
    logits = F.linear(hidden, weight, bias)
    cap = options.get("softcap")
    if cap:
        logits = cap * torch.tanh(logits / cap)
    loss = F.cross_entropy(logits.float(), target, ignore_index=options.get("ignore_index", -100),
                           reduction=options.get("reduction", "mean"),
                           label_smoothing=options.get("label_smoothing", 0.0))
    if options.get("z_loss"):
        raise BackendUnavailable("torch back-end of the model mode does not add z-loss")
    return loss


_compiled: dict[str, Callable] = {}


def torch_compile_loss(hidden, weight, target, bias, options) -> torch.Tensor:
    """``torch_loss`` under ``torch.compile`` (compiled once per process)."""
    if "fn" not in _compiled:
        _compiled["fn"] = torch.compile(torch_loss)
    return _compiled["fn"](hidden, weight, target, bias, options)


def fusedce_loss(hidden, weight, target, bias, options) -> torch.Tensor:
    import fusedce

    return fusedce.linear_cross_entropy(hidden, weight, target, bias, **options)


def liger_loss(hidden, weight, target, bias, options) -> torch.Tensor:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as exc:
        raise BackendUnavailable(f"liger-kernel is not installed ({exc})") from None
    if hidden.device.type != "cuda":
        raise BackendUnavailable("liger-kernel needs CUDA")
    loss_fn = LigerFusedLinearCrossEntropyLoss(
        ignore_index=options["ignore_index"], reduction=options["reduction"],
        label_smoothing=options["label_smoothing"], softcap=options["softcap"])
    return loss_fn(weight, hidden, target, bias)  # Liger's order: (weight, input, target, bias)


def cce_loss(hidden, weight, target, bias, options) -> torch.Tensor:
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as exc:
        raise BackendUnavailable(f"cut-cross-entropy is not installed ({exc})") from None
    if hidden.device.type != "cuda":
        raise BackendUnavailable("cut-cross-entropy needs CUDA")
    if options["label_smoothing"]:
        raise BackendUnavailable("cut-cross-entropy has no label smoothing")
    return linear_cross_entropy(hidden, weight, target, bias=bias, ignore_index=options["ignore_index"],
                                softcap=options["softcap"], reduction=options["reduction"])


_BUILTIN: dict[str, tuple[LossFn, str | None]] = {
    "torch": (torch_loss, None),
    "torch-compile": (torch_compile_loss, None),
    "fusedce": (fusedce_loss, "fusedce"),
    "liger": (liger_loss, "liger-kernel"),
    "cce": (cce_loss, "cut-cross-entropy"),
}
BUILTIN_BACKENDS = tuple(_BUILTIN)


def _package_version(dist: str | None) -> str:
    if dist is None:
        return torch.__version__
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_callable(spec: str) -> Callable:
    """``"package.module:function"`` → the function. ``ValueError`` naming what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:callable', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {spec!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"{spec!r} is not callable")
    return obj


def resolve_backend(name: str) -> LossBackend:
    """The back-end called ``name`` (a registry name or ``module:callable``)."""
    if ":" in name:
        return LossBackend(name, load_callable(name), "user")
    if name not in _BUILTIN:
        raise ValueError(f"unknown loss back-end {name!r}; available: {', '.join(BUILTIN_BACKENDS)} "
                         "or module:callable")
    fn, dist = _BUILTIN[name]
    return LossBackend(name, fn, _package_version(dist))
