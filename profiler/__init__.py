"""The profiler: measured memory, time and parity of LM-head losses, cell by cell or a whole
training step at a time. It measures and stores; every report is rendered by :mod:`reports`
from the stored files alone.

Layers: :mod:`profiler.protocol` (how a figure is taken), :mod:`profiler.cell` and
:mod:`profiler.runner` (grid cells in worker processes), :mod:`profiler.training` (training
steps, fit, parity, doctor), :mod:`profiler.models` (model sources), :mod:`profiler.store`
(the run folder: one reader and one writer).
"""
# The public names are imported on first use (PEP 562), not with the package: every worker
# starts as ``python -m profiler.worker``, which imports this package first, and importing
# the runner here would import the worker module before it runs as ``__main__``.
_EXPORTS = {
    "BackendInfo": "profiler.backends", "get_backend": "profiler.backends", "list_backends": "profiler.backends",
    "MeasureSettings": "profiler.cell", "measure_cell": "profiler.cell",
    "collect_environment": "profiler.environment",
    "GridSpec": "profiler.grid", "default_device": "profiler.grid",
    "Prediction": "profiler.memory_model", "floor_bytes": "profiler.memory_model", "predict": "profiler.memory_model",
    "MODES": "profiler.precision",
    "STATUSES": "profiler.records", "CellResult": "profiler.records", "CellSpec": "profiler.records",
    "Parity": "profiler.records",
    "GridRun": "profiler.runner", "load_results": "profiler.runner", "run_grid": "profiler.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'profiler' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
