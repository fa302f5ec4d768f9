"""The profiler: measured memory, time and parity of LM-head losses, cell by cell or a whole
training step at a time. It measures and stores; every report is rendered by :mod:`reports`
from the stored files alone.

Layers: :mod:`profiler.protocol` (how a figure is taken), :mod:`profiler.cell` and
:mod:`profiler.runner` (grid cells in worker processes), :mod:`profiler.training` (training
steps, fit, parity, doctor), :mod:`profiler.models` (model sources), :mod:`profiler.store`
(the run folder: one reader and one writer).
"""
from profiler.backends import BackendInfo, get_backend, list_backends
from profiler.cell import MeasureSettings, measure_cell
from profiler.environment import collect_environment
from profiler.grid import GridSpec, default_device
from profiler.memory_model import Prediction, floor_bytes, predict
from profiler.precision import MODES
from profiler.records import STATUSES, CellResult, CellSpec, Parity
from profiler.runner import GridRun, load_results, run_grid

__all__ = [
    "BackendInfo", "CellResult", "CellSpec", "GridRun", "GridSpec", "MODES", "MeasureSettings", "Parity",
    "Prediction", "STATUSES", "collect_environment", "default_device", "floor_bytes", "get_backend",
    "list_backends", "load_results", "measure_cell", "predict", "run_grid",
]
