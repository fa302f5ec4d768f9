"""A user's own loss as a back-end, named ``"package.module:callable"``."""
from __future__ import annotations

import importlib
import inspect

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends.base import Backend, LossFn, dist_version, options_of
from fusedce_profiler.instrument.callables import load_callable
from fusedce_profiler.instrument.records import CellSpec


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

    def signature_problem(self, option: str = "--backend") -> str | None:
        """Why the callable cannot be called ``fn(hidden, weight, target, bias)`` (``None`` when it
        can, or when that shows only once a class is instantiated): read from its signature, without
        calling it."""
        obj = load_callable(self.name, option)
        if inspect.isclass(obj):
            return None  # its __call__ is known once an instance exists: the cell says
        try:
            inspect.signature(obj).bind(*_POSITIONALS)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError):  # no signature to read (a builtin): let the cell say
                return None
            return (f"{option} {self.name}: cannot be called as {self.attr}(hidden, weight, target, bias) "
                    f"({exc}); a loss back-end takes those four and the options as keywords")
        return None

    def version(self) -> str:
        module = importlib.import_module(self.module)
        top = self.module.split(".")[0]
        return str(getattr(module, "__version__", None) or dist_version(top) or "local")

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


_POSITIONALS = ("hidden", "weight", "target", "bias")
"""Stand-ins for the four positional arguments every loss back-end is called with."""


def _changed_options(options: LossOptions) -> dict:
    default = LossOptions()
    return {name: getattr(options, name) for name in ("ignore_index", "reduction", "label_smoothing",
                                                       "z_loss", "softcap")
            if getattr(options, name) != getattr(default, name)}
