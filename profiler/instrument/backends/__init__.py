"""LM-head loss back-ends behind one interface, and their registry.

Every back-end turns ``(hidden, weight, target, bias, options) -> loss`` (shapes and dtypes
in :mod:`~fusedce_profiler.instrument.backends.base`); the caller runs the forward under the cell's autocast,
exactly as a training loop would.

- :mod:`~fusedce_profiler.instrument.backends.base`: the interface (:class:`Backend`, :class:`BackendInfo`,
  :data:`LossFn`) and a cell's options (:func:`options_of`, :func:`active_options`; the
  options themselves are :class:`fusedce.options.LossOptions`).
- :mod:`~fusedce_profiler.instrument.backends.torch_backends`: ``torch`` (:func:`torch_loss`, also the formula of
  the fp32 reference), ``torch-compile`` and ``torch-native``.
- :mod:`~fusedce_profiler.instrument.backends.fusedce_backends`: ``fusedce``, ``fusedce-min`` and
  ``fusedce-fast``, three points of fusedce's time–memory frontier (its ``memory_budget``
  default, ``"min"`` and ``"fast"``).
- :mod:`~fusedce_profiler.instrument.backends.third_party`: the optional ``liger`` and ``cce``, imported only when
  used; :func:`list_backends` reports them as "not installed" instead of raising.
- :mod:`~fusedce_profiler.instrument.backends.user`: a user's own loss, named ``"module:callable"``.
- :mod:`~fusedce_profiler.instrument.backends.patched`: the model-mode ``liger-patched`` and the
  :class:`Replacement` records of what a back-end replaced in the model.
- :mod:`~fusedce_profiler.instrument.backends.registry`: the back-ends by name (:data:`BUILTIN_BACKENDS`,
  :data:`MODEL_BACKENDS`, :func:`get_backend`, :func:`get_model_backend`,
  :func:`list_backends`).

A back-end that cannot honour an option of a cell says why in :meth:`Backend.unsupported`
and the cell is recorded as ``skipped``.
"""
from fusedce_profiler.instrument.backends.base import Backend, BackendInfo, LossFn, active_options, options_of
from fusedce_profiler.instrument.backends.patched import Replacement
from fusedce_profiler.instrument.backends.registry import (BUILTIN_BACKENDS, MODEL_BACKENDS, get_backend, get_model_backend,
                                        installed_versions, list_backends)
from fusedce_profiler.instrument.backends.torch_backends import torch_loss

__all__ = [
    "Backend", "BackendInfo", "LossFn", "options_of", "active_options", "torch_loss", "Replacement",
    "BUILTIN_BACKENDS", "MODEL_BACKENDS", "get_backend", "get_model_backend", "list_backends",
    "installed_versions",
]
