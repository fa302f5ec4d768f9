"""The benchmark's implementation names and the profiler back-ends that run them.

The adapters themselves live once, in :mod:`fusedce_profiler.instrument.backends`; the benchmark only names
them. Its names (``torch_compile`` with an underscore) are the ones in its result files
and in ``shared/ANCHORS.md``, so they stay as they are:

- ``torch``: ``F.cross_entropy(F.linear(h, W, b), y)`` eager (:func:`fusedce_profiler.instrument.backends.torch_loss`);
- ``torch_compile``: the same under ``torch.compile(dynamic=False)``, a fresh Dynamo cache per cell;
- ``liger``: liger-kernel's ``LigerFusedLinearCrossEntropyLoss``, called weight-first;
- ``cce``: cut-cross-entropy's ``linear_cross_entropy`` (its defaults: gradient filtering on);
- ``fusedce``: ``fusedce.linear_cross_entropy`` (``impl="auto"``).

Measured on request (``--impls``), not by default: ``torch_native`` (torch's own
``F.linear_cross_entropy``, chunked, where the installed torch has it) and fusedce's other
frontier points, ``fusedce_min`` (``memory_budget="min"``) and ``fusedce_fast``
(``memory_budget="fast"``).
"""
from __future__ import annotations

from fusedce_profiler.instrument.backends import Backend, get_backend

BACKEND_NAMES = {
    "torch": "torch",
    "torch_compile": "torch-compile",
    "liger": "liger",
    "cce": "cce",
    "fusedce": "fusedce",
}
"""Benchmark implementation name -> profiler back-end name, in the default measuring order."""

IMPLS = tuple(BACKEND_NAMES)
"""The implementations a run measures by default."""

EXTRA_NAMES = {
    "torch_native": "torch-native",
    "fusedce_min": "fusedce-min",
    "fusedce_fast": "fusedce-fast",
}
"""Benchmark name -> profiler back-end name of the implementations measured on request."""

ALL_IMPLS = IMPLS + tuple(EXTRA_NAMES)


def backend_for(impl: str) -> Backend:
    """The profiler back-end measured under the benchmark name ``impl``."""
    names = {**BACKEND_NAMES, **EXTRA_NAMES}
    if impl not in names:
        raise ValueError(f"impl {impl!r} is unknown; choose one of {', '.join(ALL_IMPLS)}")
    return get_backend(names[impl])


def installed_version(backend: Backend) -> str:
    """The back-end's version, or "" when it is not installed (the results files' convention)."""
    try:
        return backend.version()
    except ImportError:
        return ""
