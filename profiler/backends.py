"""LM-head loss back-ends behind one interface, and their registry.

Every back-end turns ``(hidden, weight, target, bias, options) -> loss``:

- ``hidden``: (N, H) in the mode's hidden dtype, ``requires_grad``.
- ``weight``: (V, H) in the mode's weight dtype (fp32 under amp), ``requires_grad``.
- ``target``: (N,) int64, ``options.ignore_index`` marks ignored rows.
- ``bias``: (V,) like ``weight``, or ``None``.
- returns: a scalar (``reduction`` "mean"/"sum") or (N,) (``"none"``).

The caller runs the forward under the cell's autocast, exactly as a training loop would.

``fusedce``, ``fusedce-min`` and ``fusedce-fast`` are three points of fusedce's time–memory
frontier (its ``memory_budget`` default, ``"min"`` and ``"fast"``).

Optional back-ends (``liger``, ``cce``) are imported only when used; :func:`list_backends`
reports them as "not installed" instead of raising. A back-end that cannot honour an
option of a cell says why in :meth:`Backend.unsupported` and the cell is recorded as
``skipped``. A user's own loss is named ``"module:callable"`` (see :class:`UserBackend`).

Public API: :class:`BackendInfo`, :class:`Backend`, :func:`get_backend`, :func:`list_backends`,
:data:`BUILTIN_BACKENDS`, :func:`torch_loss`, :func:`options_of`, :func:`active_options`
(the options themselves are :class:`fusedce.options.LossOptions`).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from fusedce.options import LossOptions
from profiler.callables import load_callable
from profiler.records import CellSpec


def options_of(spec: CellSpec) -> LossOptions:
    """The loss options of a grid cell."""
    return LossOptions(**spec.options())


def active_options(options: LossOptions) -> set[str]:
    """Names of the options that differ from a plain mean cross-entropy."""
    used = set()
    if options.reduction != "mean":
        used.add(f"reduction={options.reduction}")
    if options.label_smoothing:
        used.add("label_smoothing")
    if options.z_loss:
        used.add("z_loss")
    if options.softcap is not None:
        used.add("softcap")
    return used


LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", LossOptions], torch.Tensor]


@dataclass(frozen=True)
class BackendInfo:
    """What :func:`list_backends` reports for one back-end.

    ``version`` is ``None`` and ``reason`` says why when the back-end is not available.
    ``options`` lists the non-default options it honours (``"bias"``, ``"ignore_index"``,
    ``"label_smoothing"``, ``"z_loss"``, ``"softcap"``, ``"reduction=sum"``,
    ``"reduction=none"``); ``devices`` the devices it runs on.
    """

    name: str
    available: bool
    version: str | None
    reason: str
    devices: tuple[str, ...]
    options: tuple[str, ...]
    description: str


ALL_OPTIONS = ("bias", "ignore_index", "label_smoothing", "z_loss", "softcap", "reduction=sum", "reduction=none")


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


def _require(module: str) -> None:
    """Raise ``ImportError`` if ``module`` cannot be imported, without importing it."""
    try:
        found = sys.modules[module] if module in sys.modules else importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ImportError(f"No module named {module!r}")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class Backend:
    """One loss implementation. Subclasses set the class attributes and :meth:`make`."""

    name: str = ""
    description: str = ""
    devices: tuple[str, ...] = ("cuda", "cpu")
    options: tuple[str, ...] = ALL_OPTIONS

    def version(self) -> str:
        """The installed version; raises ``ImportError`` when the back-end is missing."""
        return torch.__version__

    def make(self) -> LossFn:
        """Import lazily and return the loss function."""
        raise NotImplementedError

    def info(self) -> BackendInfo:
        try:
            version, available, reason = self.version(), True, ""
        except ImportError as exc:
            version, available, reason = None, False, f"not installed ({exc})"
        return BackendInfo(self.name, available, version, reason, self.devices, self.options,
                           self.description)

    def unsupported(self, spec: CellSpec) -> str | None:
        """Why this back-end cannot run ``spec`` (``None`` when it can)."""
        try:
            self.version()
        except ImportError as exc:
            return f"{self.name} is not available: not installed ({exc})"
        device = spec.device.split(":")[0]
        if device not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)} only, not {device}"
        wanted = active_options(options_of(spec))
        if spec.bias:
            wanted.add("bias")
        if spec.ignore_frac:
            wanted.add("ignore_index")
        missing = sorted(wanted - set(self.options))
        if missing:
            return f"{self.name} does not support {', '.join(missing)}"
        return None


class TorchBackend(Backend):
    name = "torch"
    description = "eager F.cross_entropy(F.linear(h, W, b), y), as users write it"

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


class FusedceBackend(Backend):
    """``fusedce.linear_cross_entropy`` at one point of its time–memory frontier.

    ``knobs`` are its keyword arguments ``memory_budget``, ``strategy`` and
    ``grad_weight_accumulation``, passed as given (none: the default plan). An instance made
    with ``name`` and knobs is a point of its own (the benchmarks' strategy variants)."""

    name = "fusedce"
    description = "fusedce.linear_cross_entropy (this project)"
    knobs: dict = {}

    def __init__(self, name: str | None = None, **knobs) -> None:
        if name is not None:
            self.name = name
            self.description = "fusedce.linear_cross_entropy(" + ", ".join(
                f"{key}={value!r}" for key, value in knobs.items()) + ")"
        self.knobs = {**type(self).knobs, **knobs}

    def version(self) -> str:
        _require("fusedce")
        import fusedce

        return _dist_version("fusedce") or fusedce.__version__

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
        _require("liger_kernel")
        return _dist_version("liger-kernel", "liger_kernel") or "unknown"

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
        _require("cut_cross_entropy")
        return _dist_version("cut-cross-entropy", "cut_cross_entropy") or "unknown"

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


class UserBackend(Backend):
    """A user's loss named ``"package.module:callable"``.

    The callable is called ``fn(hidden, weight, target, bias)``; each option that differs
    from its default is passed as a keyword (``ignore_index``, ``reduction``,
    ``label_smoothing``, ``z_loss``, ``softcap``) and must appear in its signature (or it
    takes ``**kwargs``), otherwise the cell is skipped. A class (say an ``nn.Module``) is
    instantiated without arguments first.
    """

    devices = ("cuda", "cpu")

    def __init__(self, target: str):
        module, sep, attr = target.partition(":")
        dotted = all(part.isidentifier() for part in f"{module}.{attr}".split("."))
        if not sep or not dotted:
            raise ValueError(f"backend {target!r}: a user back-end is written 'package.module:callable'")
        self.name, self.module, self.attr = target, module, attr
        self.description = f"user callable {target}"

    def _load(self):
        obj = load_callable(self.name, "--backend")
        return obj() if inspect.isclass(obj) else obj

    def version(self) -> str:
        module = importlib.import_module(self.module)
        top = self.module.split(".")[0]
        return str(getattr(module, "__version__", None) or _dist_version(top) or "local")

    def _accepted(self, fn) -> set[str] | None:
        """Keyword names ``fn`` accepts; ``None`` means any (``**kwargs``); ``set()`` when it
        has no signature (builtins: positionals only)."""
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return set()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return {p.name for p in params}

    def unsupported(self, spec: CellSpec) -> str | None:
        try:
            fn = self._load()
        except ValueError as exc:  # cannot be imported or is not callable: the message says which
            return f"cannot import {self.name}: {exc}"
        accepted = self._accepted(fn)
        if accepted is None:
            return None
        missing = sorted(name for name in _changed_options(options_of(spec)) if name not in accepted)
        return f"{self.name} takes no {', '.join(missing)} argument" if missing else None

    def make(self) -> LossFn:
        fn = self._load()

        def loss(hidden, weight, target, bias, options: LossOptions):
            return fn(hidden, weight, target, bias, **_changed_options(options))

        return loss


def _changed_options(options: LossOptions) -> dict:
    default = LossOptions()
    return {name: getattr(options, name) for name in ("ignore_index", "reduction", "label_smoothing",
                                                       "z_loss", "softcap")
            if getattr(options, name) != getattr(default, name)}


class LigerPatchedBackend(Backend):
    """Liger-Kernel's whole-model patching of a Hugging Face model:
    ``liger_kernel.transformers.apply_liger_kernel_to_<model_type>(model=...)`` with the fused
    linear cross-entropy on, which also swaps RMSNorm, the SwiGLU/GeGLU MLP and RoPE for
    Liger's kernels. Not a loss function: the training step calls the patched model with
    labels (:mod:`profiler.training.patching`); model mode only."""

    name = "liger-patched"
    description = "liger_kernel.transformers.apply_liger_kernel_to_<arch>(model=...): norms, MLP, RoPE and the loss"
    devices = ("cuda",)
    options = ("ignore_index", "softcap")
    patches_model = True

    def version(self) -> str:
        _require("liger_kernel")
        return _dist_version("liger-kernel", "liger_kernel") or "unknown"

    def make(self) -> LossFn:
        raise TypeError("liger-patched patches a model; it has no loss function of its own")


@dataclass(frozen=True)
class Replacement:
    """What a back-end replaced in the model: ``group`` is one of
    :data:`profiler.attribution.GROUPS` ("LM-head/loss", "norms", "MLP", "attention", ...),
    ``what`` names it (``LlamaRMSNorm.forward``), ``count`` how many modules."""

    group: str
    what: str
    count: int = 1


#: Back-ends of the model mode only (they change the model, not just the loss).
MODEL_BACKENDS: dict[str, type[Backend]] = {LigerPatchedBackend.name: LigerPatchedBackend}


def get_model_backend(name: str) -> Backend:
    """A model-mode back-end: :data:`MODEL_BACKENDS` first, then :func:`get_backend`."""
    if name in MODEL_BACKENDS:
        return MODEL_BACKENDS[name]()
    return get_backend(name)


BUILTIN_BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (TorchBackend, TorchCompileBackend, TorchNativeBackend, FusedceBackend,
                              FusedceMinBackend, FusedceFastBackend, LigerBackend, CceBackend)
}


def get_backend(name: str) -> Backend:
    """The back-end called ``name`` (a built-in name or ``"module:callable"``).

    Raises ``ValueError`` naming the known back-ends for anything else. Does not import
    optional packages: that happens in :meth:`Backend.make` / :meth:`Backend.version`.
    """
    if name in BUILTIN_BACKENDS:
        return BUILTIN_BACKENDS[name]()
    if ":" in name:
        return UserBackend(name)
    raise ValueError(f"backend {name!r} is unknown; choose one of {', '.join(BUILTIN_BACKENDS)} "
                     "or give 'package.module:callable'")


def list_backends() -> list[BackendInfo]:
    """Every built-in back-end with its version, or ``available=False`` and the reason."""
    return [cls().info() for cls in BUILTIN_BACKENDS.values()]
