"""The profiler: grid runs of LM-head loss back-ends with memory, time and parity.

The API the CLI and reports build on:

- :func:`run_grid` (``GridSpec``, out_dir, resume=, snapshot=, on_cell=,
  cell_timeout_s=, fresh_worker_per_cell=) → ``list[CellResult]``; writes
  ``DIR/results.jsonl``, ``DIR/environment.json``, ``DIR/snapshots/``, ``DIR/logs/``.
- :class:`GridSpec` (``validate()`` raises ``ValueError`` naming the bad field,
  ``cells()`` → ``list[CellSpec]``); :func:`measure_cell` measures one cell in-process.
- :func:`load_results` (results.jsonl or its folder) → ``list[CellResult]``.
- :func:`list_backends` → ``list[BackendInfo]``; :func:`collect_environment` → dict.
- :func:`predict` (``CellSpec``) → ``Prediction``; :func:`floor_bytes`.
- :func:`load_snapshot`, :func:`parse_timeline`, :func:`plot_timeline`: rebuild a
  memory-timeline PNG from a stored snapshot, without a GPU.
"""
from profiler.backends import BackendInfo, LossOptions, get_backend, list_backends
from profiler.environment import collect_environment
from profiler.grid import GridSpec, default_device
from profiler.measure import MeasureSettings, measure_cell
from profiler.memory_model import Prediction, floor_bytes, predict
from profiler.records import MODES, STATUSES, CellResult, CellSpec, Parity
from profiler.runner import ENVIRONMENT_FILE, RESULTS_FILE, load_results, run_grid
from profiler.snapshot import LiveBlock, Timeline, load_snapshot, parse_timeline
from profiler.timeline_plot import plot_timeline

__all__ = [
    "BackendInfo", "CellResult", "CellSpec", "ENVIRONMENT_FILE", "GridSpec", "LiveBlock", "LossOptions",
    "MODES", "MeasureSettings", "Parity", "Prediction", "RESULTS_FILE", "STATUSES", "Timeline",
    "collect_environment", "default_device", "floor_bytes", "get_backend", "list_backends", "load_results",
    "load_snapshot", "measure_cell", "parse_timeline", "plot_timeline", "predict", "run_grid",
]
