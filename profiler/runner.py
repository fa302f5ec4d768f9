"""Run a grid: cells in worker subprocesses, results appended to ``DIR/results.jsonl``.

Output folder ``DIR``:

- ``results.jsonl``: one :class:`~profiler.records.CellResult` per line, appended (and
  fsync'ed) as each cell finishes: a killed run loses nothing but the cell in flight,
  and Ctrl-C leaves only whole lines. ``resume=True`` skips the cells already there
  (matched by :meth:`CellSpec.key`); without it an existing non-empty file is an error.
- ``environment.json``: :func:`~profiler.environment.collect_environment`, taken in a
  worker (the parent never touches the GPU); a resumed run in a different environment
  adds its own under ``"resumed"``.
- ``snapshots/<cell>.pickle.gz`` and ``snapshots/<cell>.png`` with ``snapshot=True``
  (CUDA cells only); ``CellResult.snapshot_path`` / ``timeline_png`` are relative to ``DIR``.
- ``logs/worker-*.log``: each worker's stdout/stderr.

Public API: :func:`run_grid`, :func:`load_results`, :data:`RESULTS_FILE`,
:data:`ENVIRONMENT_FILE`.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Callable

from profiler.backends import get_backend
from profiler.grid import GridSpec
from profiler.measure import MeasureSettings
from profiler.memory_model import floor_bytes, predict
from profiler.records import CellResult
from profiler.worker import Worker

RESULTS_FILE = "results.jsonl"
ENVIRONMENT_FILE = "environment.json"


def load_results(path: str | Path) -> list[CellResult]:
    """Every whole line of a ``results.jsonl`` (a missing file gives ``[]``).

    ``path`` may be the file or its folder. A last line cut short by a killed run is
    ignored; a malformed line elsewhere is skipped with a warning naming its number.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    results = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            results.append(CellResult.from_json(line))
        except (json.JSONDecodeError, TypeError, KeyError) as exc:
            if number < len(lines):  # the unterminated last piece is an interrupted write
                warnings.warn(f"{path}:{number}: skipped a malformed result line ({exc})", stacklevel=2)
    return results


def _drop_partial_line(path: Path) -> None:
    """Cut an unterminated last line (a write interrupted by a kill) before appending."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)


def _append(path: Path, result: CellResult) -> None:
    with path.open("a") as fh:
        fh.write(result.to_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _skipped(spec, reason: str) -> CellResult:
    result = CellResult(spec=spec, status="skipped", message=reason,
                        memory_source="cuda-allocator" if spec.device.startswith("cuda") else "cpu-profiler")
    result.floor_bytes = floor_bytes(spec)
    result.predicted_bytes = predict(spec).peak_bytes
    return result


def _relative_paths(result: CellResult, out: Path) -> None:
    """Store snapshot paths relative to the output folder, so the folder can move."""
    for name in ("snapshot_path", "timeline_png"):
        value = getattr(result, name)
        if value:
            setattr(result, name, os.path.relpath(value, out))


def _write_environment(path: Path, environment: dict | None, resumed: bool) -> None:
    """Write the environment; a resumed run in a different one is added under ``"resumed"``."""
    if environment is None:
        return
    if resumed and path.exists():
        stored = json.loads(path.read_text())
        same = {k: v for k, v in stored.items() if k not in ("date", "resumed")} == \
            {k: v for k, v in environment.items() if k != "date"}
        if same:
            return
        stored.setdefault("resumed", []).append(environment)
        environment = stored
    path.write_text(json.dumps(environment, indent=2, sort_keys=True) + "\n")


def run_grid(grid: GridSpec, out_dir: str | Path, *, resume: bool = False, snapshot: bool = False,
             on_cell: Callable[[CellResult], None] | None = None,
             cell_timeout_s: float | None = None, fresh_worker_per_cell: bool = False) -> list[CellResult]:
    """Measure every cell of ``grid`` into ``out_dir``; return all results in grid order.

    ``on_cell`` is called with each newly measured result (not with resumed ones), e.g.
    to print a table row. ``cell_timeout_s``: a cell still running after that long is
    recorded as ``error`` and its worker killed. A worker serves cells until one fails
    (``oom``/``error``), then a fresh one takes over; ``fresh_worker_per_cell`` starts a
    new process for every cell (nothing shared, not even Triton's or inductor's
    in-memory caches; costs an interpreter and CUDA start-up per cell).

    Raises ``ValueError`` for a bad grid, ``FileExistsError`` if ``out_dir`` holds
    results and ``resume`` is false; ``KeyboardInterrupt`` propagates after the worker
    is stopped (the results file keeps only whole lines).
    """
    cells = grid.cells()
    out = Path(out_dir)
    results_path = out / RESULTS_FILE
    if not resume and results_path.exists() and results_path.stat().st_size:
        raise FileExistsError(f"{results_path} already holds results; resume, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(results_path)
    done = {r.spec.key(): r for r in load_results(results_path)} if resume else {}
    settings = MeasureSettings(warmup=grid.warmup, repeats=grid.repeats,
                               snapshot_dir=str(out / "snapshots") if snapshot and grid.device != "cpu" else None)
    results: list[CellResult] = []
    worker: Worker | None = None
    environment_written = False
    try:
        for spec in cells:
            if spec.key() in done:
                results.append(done[spec.key()])
                continue
            reason = get_backend(spec.backend).unsupported(spec)
            if reason:
                result = _skipped(spec, reason)
            else:
                if worker is None:
                    worker = Worker(out / "logs")
                if not environment_written:  # taken in the worker: the parent never touches the GPU
                    _write_environment(out / ENVIRONMENT_FILE, worker.environment(), resumed=bool(done))
                    environment_written = True
                result = worker.run(spec, settings, cell_timeout_s)
                _relative_paths(result, out)
                if result.status in ("oom", "error") or fresh_worker_per_cell:
                    worker.close()
                    worker = None
            _append(results_path, result)
            results.append(result)
            if on_cell is not None:
                on_cell(result)
    finally:
        if worker is not None:
            worker.close()
    if not environment_written and len(results) > len(done):  # every new cell was skipped
        from profiler.environment import collect_environment

        _write_environment(out / ENVIRONMENT_FILE, collect_environment(), resumed=bool(done))
    return results
