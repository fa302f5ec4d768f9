"""Run a grid: each cell in a worker process, each result appended to the run folder.

Files (names in :mod:`profiler.store`): ``results.jsonl`` gets one
:class:`~profiler.records.CellResult` per line, appended and fsync'ed as each cell
finishes, so a killed run loses nothing but the cell in flight. ``resume=True`` skips the
cells already there (matched by :meth:`CellSpec.key`); without it an existing non-empty
file is an error. ``environment.json`` is taken in a worker (the parent never touches the
GPU); a resumed run in a different environment adds its own under ``"resumed"``.
``snapshots/`` holds the allocator snapshots and timelines of ``snapshot=True`` (CUDA
cells only; paths in the results are relative to the folder). ``logs/`` holds each
worker's output, tracebacks included; an ``error`` or ``timeout`` row names its log.

A worker serves cells until one fails (``oom``, ``error``, ``timeout``), then a fresh one
takes over. A cell still running after ``cell_timeout_s`` is recorded as ``timeout``, its
worker killed, and the run goes on. A worker that dies at start-up (before it could take
any job) stops the run: :class:`~profiler.worker.WorkerDied` with ``at_start`` propagates,
since every later cell would fail the same way. A result that cannot be stored (a full
disk, a file-size limit) stops the run with :class:`ResultNotStored`, naming the cell.

``plan.json`` (:func:`save_plan`, :func:`planned_cells`) lists every cell a run set out
to measure, so that a report can say how much of it is missing.

Public API: :func:`run_grid`, :func:`load_results`, :class:`GridRun`, :class:`ResultNotStored`,
:func:`save_plan`, :func:`planned_cells`.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from profiler import store
from profiler.backends import get_backend
from profiler.environment import save_environment
from profiler.grid import GridSpec
from profiler.memory_model import floor_bytes, predict
from profiler.protocol import memory_source
from profiler.records import CellResult, CellSpec
from profiler.cell import MeasureSettings
from profiler.worker import JobFailed, Worker, WorkerDied


class ResultNotStored(OSError):
    """The result of ``spec`` could not be appended to ``results.jsonl`` (the OS error's
    ``errno``, ``strerror`` and ``filename`` are kept); ``--resume`` measures it again."""

    def __init__(self, spec: CellSpec, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), cause.filename)
        self.spec = spec


def save_plan(folder: str | Path, cells: list[CellSpec]) -> Path:
    """Store the cells a run sets out to measure (``plan.json``), before it measures any."""
    return store.write_json(Path(folder) / store.PLAN_FILE, {"cells": [asdict(spec) for spec in cells]})


def planned_cells(folder: str | Path) -> list[CellSpec] | None:
    """The cells of ``plan.json``; ``None`` when there is none or it cannot be read."""
    path = Path(folder) / store.PLAN_FILE
    if not path.is_file():
        return None
    try:
        raw = store.read_json(path)
        return [CellSpec.from_dict(cell) for cell in raw["cells"]]
    except (ValueError, TypeError, KeyError):
        return None


def load_results(folder: str | Path) -> store.Loaded[CellResult]:
    """The rows of a run folder's ``results.jsonl`` (the one reader; see :mod:`profiler.store`)."""
    path = Path(folder)
    if path.is_dir():
        path = path / store.RESULTS_FILE
    return store.read_jsonl(path, CellResult.from_dict)


@dataclass
class GridRun:
    """What :func:`run_grid` did: every result in grid order, and what it noticed on the way.

    ``notes``: sentences for the user (a damaged line skipped, a cut last line, ...).
    ``resumed``: how many cells came from an earlier run.
    """

    results: list[CellResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resumed: int = 0


def _unmeasured(spec: CellSpec, status: str, message: str) -> CellResult:
    result = CellResult(spec=spec, status=status, message=message, memory_source=memory_source(spec.device))
    result.floor_bytes = floor_bytes(spec)
    result.predicted_bytes = predict(spec).peak_bytes
    return result


def _relative_paths(result: CellResult, out: Path) -> None:
    """Store snapshot paths relative to the output folder, so the folder can move."""
    for name in ("snapshot_path", "timeline_path", "log_path"):
        value = getattr(result, name)
        if value:
            setattr(result, name, os.path.relpath(value, out))


def _write_environment(path: Path, environment: dict, resumed: bool) -> None:
    """Write the environment; a resumed run in a different one is added under ``"resumed"``."""
    if resumed and path.is_file():
        try:
            stored = store.read_json(path)
        except ValueError:
            stored = None
        if isinstance(stored, dict):
            same = ({k: v for k, v in stored.items() if k not in ("date", "resumed")}
                    == {k: v for k, v in environment.items() if k != "date"})
            if same:
                return
            stored.setdefault("resumed", []).append(environment)
            environment = stored
    save_environment(path.parent, environment)


class _Cells:
    """Runs cells in a worker, replacing it after a failure; writes the environment once."""

    def __init__(self, out: Path, settings: MeasureSettings, timeout_s: float | None, fresh_per_cell: bool,
                 resumed: bool) -> None:
        self.out, self.settings, self.timeout_s = out, settings, timeout_s
        self.fresh_per_cell, self.resumed = fresh_per_cell, resumed
        self.worker: Worker | None = None
        self.environment_written = False

    def _worker(self) -> Worker:
        if self.worker is None:
            self.worker = Worker(self.out / store.LOGS_DIR)
        if not self.environment_written:
            environment = self.worker.call("environment", timeout_s=300)
            _write_environment(self.out / store.ENVIRONMENT_FILE, environment, self.resumed)
            self.environment_written = True
        return self.worker

    def measure(self, spec: CellSpec) -> CellResult:
        try:
            worker = self._worker()
            raw = worker.call("cell", {"spec": asdict(spec), "settings": asdict(self.settings)}, self.timeout_s)
            result = CellResult.from_dict(raw)
            if result.status in ("error", "timeout"):
                result.log_path = str(worker.log_path)
        except WorkerDied as died:
            self.worker = None
            if died.at_start:
                raise
            status = "timeout" if died.timed_out else "error"
            what = f"timed out after {self.timeout_s:g} s; log {died.log_path}" if died.timed_out else died.summary
            result = _unmeasured(spec, status, what + (f"\n{died.tail}" if died.tail else ""))
            result.log_path = str(died.log_path)
        except JobFailed as failed:  # the job itself raised, e.g. it could not import its module
            result = _unmeasured(spec, "error", str(failed))
            result.log_path = str(self.worker.log_path)
        if result.status not in ("ok", "skipped") or self.fresh_per_cell:
            self.close()
        return result

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def run_grid(grid: GridSpec, out_dir: str | Path, *, resume: bool = False, snapshot: bool = False,
             on_cell: Callable[[CellResult], None] | None = None, on_start: Callable[[CellSpec], None] | None = None,
             cell_timeout_s: float | None = None, fresh_worker_per_cell: bool = False) -> GridRun:
    """Measure every cell of ``grid`` into ``out_dir``; return all results in grid order.

    ``on_start`` / ``on_cell`` are called before each newly measured cell and with its
    result (not for resumed ones), e.g. for a progress display. ``cell_timeout_s``: a cell
    still running after that long is recorded as ``timeout``. ``fresh_worker_per_cell``
    starts a new process for every cell (nothing shared, not even in-memory compile caches).

    Raises ``ValueError`` for a bad grid, ``FileExistsError`` if ``out_dir`` holds results
    and ``resume`` is false; ``KeyboardInterrupt`` (and whatever the caller raises from a
    signal handler) propagates after the worker is stopped, the results file holding only
    whole lines. :class:`ResultNotStored` when a result cannot be written, and
    :class:`~profiler.worker.WorkerDied` (``at_start``) when a worker cannot start, stop the
    run the same way. The caller holds the folder's :class:`~profiler.store.RunLock`.
    """
    cells = grid.cells()
    out = Path(out_dir)
    results_path = out / store.RESULTS_FILE
    if not resume and results_path.exists() and results_path.stat().st_size:
        raise FileExistsError(f"{results_path} already holds results; resume, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    run = GridRun()
    if store.cut_partial_line(results_path):
        run.notes.append(f"{results_path}: cut a last line left unfinished by an interrupted run; "
                         "that cell is measured again")
    done: dict[str, CellResult] = {}
    if resume:
        loaded = load_results(results_path)
        run.notes += [f"{p}; that cell is measured again" for p in loaded.problems]
        done = {r.spec.key(): r for r in loaded.records}
    snapshot_dir = str(out / store.SNAPSHOTS_DIR) if snapshot and grid.device != "cpu" else None
    settings = MeasureSettings(warmup=grid.warmup, repeats=grid.repeats, snapshot_dir=snapshot_dir)
    runner = _Cells(out, settings, cell_timeout_s, fresh_worker_per_cell, resumed=bool(done))
    try:
        for spec in cells:
            if spec.key() in done:
                run.results.append(done[spec.key()])
                run.resumed += 1
                continue
            if on_start is not None:
                on_start(spec)
            reason = get_backend(spec.backend).unsupported(spec)
            result = _unmeasured(spec, "skipped", reason) if reason else runner.measure(spec)
            _relative_paths(result, out)
            try:
                store.append_jsonl(results_path, result.to_dict())
            except OSError as exc:
                raise ResultNotStored(spec, exc) from exc
            run.results.append(result)
            if on_cell is not None:
                on_cell(result)
    finally:
        runner.close()
    if not runner.environment_written and len(run.results) > len(done):  # every new cell was skipped
        from profiler.environment import collect_environment

        _write_environment(out / store.ENVIRONMENT_FILE, collect_environment(), resumed=bool(done))
    return run
