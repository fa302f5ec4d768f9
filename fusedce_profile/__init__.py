"""``fusedce_profile``: the public Python face of fusedce-profile — every command as a function,
and a recorder for a training step inside your own loop.

Commands (each writes the run folder the command writes and returns the typed records it stored;
bad input raises :class:`fusedce_profile.errors.UsageError` before anything is measured):

- :func:`run_grid` (:mod:`fusedce_profile.grid`, also ``run_default``): ``fusedce-profile grid``;
- :func:`profile_model` (:mod:`fusedce_profile.model`): ``fusedce-profile model``;
- :func:`parity` (:mod:`fusedce_profile.parity`): ``fusedce-profile parity``;
- :func:`doctor` (:mod:`fusedce_profile.doctor`), :func:`explain` (:mod:`fusedce_profile.explain`);
- :func:`build_report` (:mod:`fusedce_profile.report`): ``fusedce-profile report DIR``.

Your own loop: :class:`StepRecorder`, :func:`record_step` (:mod:`fusedce_profile.recorder`) write the
named steps of any loop as a run folder that :func:`build_report` renders;
``fusedce_profile.lightning.StepRecorderCallback`` (``lightning``),
``fusedce_profile.pytorch_lightning.StepRecorderCallback`` (``pytorch_lightning``) and
``fusedce_profile.hf.StepRecorderCallback`` (``transformers.Trainer``) do the same inside a trainer;
they are imported only from their own submodules (Lightning and transformers are optional:
``pip install "fusedce[lightning]"`` / ``"fusedce[hf]"``).

Names are imported on first use: ``import fusedce_profile`` loads neither torch nor a command.
``fusedce_profile.parity`` (and ``doctor``, ``explain``) is always the function, also after its
module was imported; the module is ``sys.modules["fusedce_profile.parity"]``, and
``from fusedce_profile.parity import parity`` imports the function from it.
"""
from __future__ import annotations

import importlib
import sys
import types

_EXPORTS = {
    "StepRecorder": "fusedce_profile.recorder",
    "record_step": "fusedce_profile.recorder",
    "write_report": "fusedce_profile.recorder",
    "run_grid": "fusedce_profile.grid",
    "profile_model": "fusedce_profile.model",
    "parity": "fusedce_profile.parity",
    "doctor": "fusedce_profile.doctor",
    "explain": "fusedce_profile.explain",
    "build_report": "fusedce_profile.report",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the module defining ``name`` on first access (PEP 562); a submodule of the same
    name (``fusedce_profile.parity``) is shadowed by its function once accessed this way."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """This package's module type: importing a submodule does not replace the exported function of
    the same name (Python's import sets the submodule as an attribute of its package)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
