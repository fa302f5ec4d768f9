"""Run a grid: each cell in a worker process, each result appended to the run folder.

Files (names in :mod:`fusedce_profiler.instrument.store`): ``results.jsonl`` gets one
:class:`~fusedce_profiler.instrument.records.CellResult` per line, appended and fsync'ed as each cell
finishes, so a killed run loses nothing but the cell in flight. ``resume=True`` skips the
cells already there (matched by :meth:`CellSpec.key`); without it an existing non-empty
file is an error. ``environment.json`` is taken in a worker (the parent never touches the
GPU); a resumed run in a different environment adds its own under ``"resumed"``.
``snapshots/`` holds the allocator snapshots and timelines of ``snapshot=True`` (CUDA
cells only; paths in the results are relative to the folder). ``logs/`` holds each
worker's output, tracebacks included; an ``error`` or ``timeout`` row names its log.

A CPU grid's worker runs with :data:`~fusedce_profiler.instrument.protocol.CPU_WORKER_ENV`
(unless the caller's environment sets those variables): its repeated steps reuse freed blocks,
and its OpenMP threads do not spin between ops; it starts the CPU meter once and imports what a
custom op's first call imports before its first cell
(:data:`~fusedce_profiler.instrument.protocol.CPU_WORKER_WARM_UP`), so a fresh worker's first
cell is timed as any other.

A worker serves cells until one fails (``oom``, ``error``, ``timeout``), then a fresh one
takes over. A cell still running after ``cell_timeout_s`` is recorded as ``timeout``, its
worker killed, and the run goes on. A memory guard watches the worker's resident memory (host
memory, RSS) while a cell runs: a worker that grows past ``max_rss_bytes`` (default
:func:`~fusedce_profiler.instrument.worker.default_max_rss_bytes`, three quarters of the machine's
memory) is killed, its cell recorded as ``error`` naming the back-end and the limit, and the run
goes on with a fresh worker: a back-end that allocates without bound is stopped by the tool, not
by the kernel's OOM killer. A worker that dies at start-up (before it could take
any job) stops the run: :class:`~fusedce_profiler.instrument.worker.WorkerDied` with ``at_start`` propagates,
since every later cell would fail the same way. A result that cannot be stored (a full
disk, a file-size limit) stops the run with :class:`ResultNotStored`, naming the cell.

``devices`` spreads the cells over several GPUs: one worker per device, started with
``CUDA_VISIBLE_DEVICES`` set to that device alone (so every cell sees one GPU, ``cuda:0``),
each fed from one shared queue in grid order by a thread of the parent. Cells are
independent (no collective); a failing cell is recorded on its own and its device goes on
with a fresh worker. A device whose worker cannot even start (its first job, the
environment, dies) is dropped with a note before it takes any cell; cells left when no device is left are recorded as ``error``. Each result is appended once,
under a lock, as it finishes (so ``results.jsonl`` is in finishing order; ``--resume``
matches cells by key and is unchanged).
``plan.json`` (:mod:`fusedce_profiler.grid.plan`) lists every cell a run set out
to measure, so that a report can say how much of it is missing.

Public API: :func:`run_grid`, :func:`load_results`, :class:`GridRun`, :class:`ResultNotStored`.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.backends import get_backend
from fusedce_profiler.instrument.callables import user_backend
from fusedce_profiler.instrument.environment import save_environment
from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.grid.memory_model import floor_bytes, predict
from fusedce_profiler.instrument.protocol import CPU_WORKER_ENV, CPU_WORKER_WARM_UP, memory_source
from fusedce_profiler.instrument.records import FAILED_STATUSES, CellResult, CellSpec
from fusedce_profiler.instrument.records import load_results  # noqa: F401 - part of this API
from fusedce_profiler.grid.cell import MeasureSettings
from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, default_max_rss_bytes


class ResultNotStored(OSError):
    """The result of ``spec`` could not be appended to ``results.jsonl`` (the OS error's
    ``errno``, ``strerror`` and ``filename`` are kept); ``--resume`` measures it again."""

    def __init__(self, spec: CellSpec, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), cause.filename)
        self.spec = spec


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


def _over_memory_message(backend: str, max_rss_bytes: int, log: str) -> str:
    """The message of a cell whose worker was stopped by the memory guard (``log``: its log, as named
    in the run folder)."""
    return (f"{backend} grew past the memory limit of {max_rss_bytes / 2**30:.3g} GiB of host memory "
            f"(the worker's, with every process it started); the worker was stopped; log {log}")


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


class _Environment:
    """``environment.json`` of the run, written once whichever worker reports first."""

    def __init__(self, out: Path, resumed: bool) -> None:
        self.path, self.resumed = out / store.ENVIRONMENT_FILE, resumed
        self.written = False
        self._lock = threading.Lock()

    def take(self, worker: Worker, always: bool = False) -> None:
        """Ask ``worker`` for its environment (unless written and not ``always``); write the first."""
        if self.written and not always:
            return
        environment = worker.call("environment", timeout_s=300)
        with self._lock:
            if not self.written:
                _write_environment(self.path, environment, self.resumed)
                self.written = True


class _Cells:
    """Runs cells in a worker (with ``env`` as its environment variables, default the
    parent's), each under ``timeout_s`` and the memory guard ``max_rss_bytes``, replacing the
    worker after a failure."""

    def __init__(self, out: Path, settings: MeasureSettings, timeout_s: float | None, max_rss_bytes: int,
                 fresh_per_cell: bool, environment: _Environment, env: dict | None = None,
                 warm_up: tuple[str, ...] = ()) -> None:
        self.out, self.settings, self.timeout_s, self.max_rss_bytes = out, settings, timeout_s, max_rss_bytes
        self.fresh_per_cell, self.environment, self.env, self.warm_up = fresh_per_cell, environment, env, warm_up
        self.worker: Worker | None = None

    def _start_worker(self) -> Worker:
        return Worker(self.out / store.LOGS_DIR, env=self.env, preload=("environment", "cell"), warm_up=self.warm_up)

    def start(self) -> None:
        """Start the worker and take its environment: ``WorkerDied`` if it cannot."""
        if self.worker is None:
            self.worker = self._start_worker()
        try:
            self.environment.take(self.worker, always=True)
        except WorkerDied:
            self.worker = None
            raise

    def _worker(self, tenant: str | None) -> Worker:
        self.worker = Worker.kept_for(self.worker, tenant)  # a user back-end's worker runs its cells alone
        if self.worker is None:
            self.worker = self._start_worker()
        self.environment.take(self.worker)
        return self.worker

    def measure(self, spec: CellSpec) -> CellResult:
        try:
            tenant = user_backend(spec.backend)
            worker = self._worker(tenant)
            result = worker.call("cell", {"spec": asdict(spec), "settings": asdict(self.settings)}, self.timeout_s,
                                 max_rss_bytes=self.max_rss_bytes, read=lambda raw: CellResult.answering(spec, raw),
                                 tenant=tenant)
            if result.status in FAILED_STATUSES:
                result.log_path = str(worker.log_path)
        except WorkerDied as died:
            self.worker = None
            if died.at_start:
                raise
            status = "timeout" if died.timed_out else "error"
            log = os.path.relpath(died.log_path, self.out)
            if died.over_memory:  # the log's tail is the back-end's own output, no cause
                result = _unmeasured(spec, status, _over_memory_message(spec.backend, self.max_rss_bytes, log))
            else:
                what = f"timed out after {self.timeout_s:g} s; log {log}" if died.timed_out else died.summary_in(self.out)
                result = _unmeasured(spec, status, what + (f"\n{died.tail}" if died.tail else ""))
            result.log_path = str(died.log_path)
        except JobFailed as failed:  # the job itself raised, e.g. it could not import its module
            result = _unmeasured(spec, "error", f"{failed.summary_in(self.out)}:\n{failed.error}")
            result.log_path = str(self.worker.log_path)
        if result.status not in ("ok", "skipped") or self.fresh_per_cell:
            self.close()
        return result

    def result(self, spec: CellSpec) -> CellResult:
        """``spec``'s result: ``skipped`` without a worker when a built-in back-end cannot run it. A
        user back-end (``module:callable``) is asked in the worker (the cell job skips it there):
        asking it here would import its module and make it in this process."""
        if user_backend(spec.backend):
            return self.measure(spec)
        reason = get_backend(spec.backend).unsupported(spec)
        return _unmeasured(spec, "skipped", reason) if reason else self.measure(spec)

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()


def _on_devices(pending: list[CellSpec], devices: Sequence[str], make_cells: Callable[[dict], _Cells],
                record: Callable[[CellResult], None], on_start: Callable[[CellSpec], None] | None,
                notes: list[str]) -> None:
    """Measure ``pending`` with one worker per device (see the module docstring); ``record``
    each result as it comes. A ``BaseException`` in the parent (Ctrl-C) stops every worker,
    records nothing more and propagates."""
    queue = collections.deque(pending)
    lock, stop = threading.Lock(), threading.Event()
    runners: list[_Cells] = []

    def serve(device: str) -> None:
        cells = make_cells({**os.environ, "CUDA_VISIBLE_DEVICES": device})
        with lock:
            runners.append(cells)
        try:
            serve_with(device, cells)
        finally:
            cells.close()

    def serve_with(device: str, cells: _Cells) -> None:
        try:
            cells.start()
        except WorkerDied as died:
            with lock:
                notes.append(f"device {device}: {died.reason} at start-up (log {died.log_path}); "
                             "its cells went to the other devices")
            return
        except Exception:  # the parent stopped the worker under it
            if stop.is_set():
                return
            raise
        while not stop.is_set():
            with lock:
                if not queue:
                    return
                spec = queue.popleft()
                if on_start is not None:
                    on_start(spec)
            try:
                result = cells.result(spec)
            except Exception:
                if stop.is_set():
                    return
                raise
            with lock:
                if stop.is_set():
                    return
                record(result)

    errors: list[BaseException] = []

    def thread_main(device: str) -> None:
        try:
            serve(device)
        except BaseException as exc:  # noqa: BLE001 - handed to the parent thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=thread_main, args=(d,), name=f"cells-{d}", daemon=True) for d in devices]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except BaseException:
        stop.set()
        with lock:
            for cells in runners:
                cells.close()
        for thread in threads:
            thread.join(10)
        raise
    if errors:
        raise errors[0]
    for spec in queue:  # every device dropped out
        record(_unmeasured(spec, "error", "no device could start a worker: " + "; ".join(notes)))


def run_grid(grid: GridSpec | Sequence[GridSpec], out_dir: str | Path, *, resume: bool = False, snapshot: bool = False,
             on_cell: Callable[[CellResult], None] | None = None, on_start: Callable[[CellSpec], None] | None = None,
             cell_timeout_s: float | None = None, max_rss_bytes: int | None = None,
             fresh_worker_per_cell: bool = False, devices: Sequence[str] | None = None) -> GridRun:
    """Measure every cell of ``grid`` into ``out_dir``; return all results in grid order.

    ``grid`` may be several grids (e.g. one per head) of the same device, warm-up and repeats:
    their cells run in that order, by the same worker, as one grid (a cell in two of them once).

    ``on_start`` / ``on_cell`` are called before each newly measured cell and with its
    result (not for resumed ones), e.g. for a progress display. ``cell_timeout_s``: a cell
    still running after that long is recorded as ``timeout``. ``max_rss_bytes``: the memory guard
    on each worker's resident memory while a cell runs (default
    :func:`~fusedce_profiler.instrument.worker.default_max_rss_bytes`); a cell that grows past it is
    recorded as ``error`` (see the module docstring). ``fresh_worker_per_cell``
    starts a new process for every cell (nothing shared, not even in-memory compile caches).
    ``devices``: ``CUDA_VISIBLE_DEVICES`` values, one worker each, cells spread over them
    (see the module docstring); ``None`` runs every cell in one worker of the parent's
    environment.

    Raises ``ValueError`` for a bad grid, ``FileExistsError`` if ``out_dir`` holds results
    and ``resume`` is false; ``KeyboardInterrupt`` (and whatever the caller raises from a
    signal handler) propagates after the worker is stopped, the results file holding only
    whole lines. :class:`ResultNotStored` when a result cannot be written, and
    :class:`~fusedce_profiler.instrument.worker.WorkerDied` (``at_start``) when a worker cannot start, stop the
    run the same way. The caller holds the folder's :class:`~fusedce_profiler.instrument.store.RunLock`.
    """
    grids = (grid,) if isinstance(grid, GridSpec) else tuple(grid)
    if not grids:
        raise ValueError("no grid to run")
    first = grids[0]
    if any((g.device, g.warmup, g.repeats) != (first.device, first.warmup, first.repeats) for g in grids):
        raise ValueError("grids run together must share device, warmup and repeats")
    cells = list({spec.key(): spec for g in grids for spec in g.cells()}.values())
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
    snapshot_dir = str(out / store.SNAPSHOTS_DIR) if snapshot and first.device != "cpu" else None
    settings = MeasureSettings(warmup=first.warmup, repeats=first.repeats, snapshot_dir=snapshot_dir)
    if devices is not None and not devices:
        raise ValueError("devices must name at least one device (or be None)")
    if max_rss_bytes is None:
        max_rss_bytes = default_max_rss_bytes()
    elif max_rss_bytes <= 0:
        raise ValueError(f"max_rss_bytes must be a number of bytes above 0, got {max_rss_bytes!r}")
    environment = _Environment(out, resumed=bool(done))
    pending = [spec for spec in cells if spec.key() not in done]
    measured: dict[str, CellResult] = {}

    def record(result: CellResult) -> None:
        _relative_paths(result, out)
        try:
            store.append_jsonl(results_path, result.to_dict())
        except OSError as exc:
            raise ResultNotStored(result.spec, exc) from exc
        measured[result.spec.key()] = result
        if on_cell is not None:
            on_cell(result)

    def make_cells(env: dict | None = None, warm_up: tuple[str, ...] = ()) -> _Cells:
        return _Cells(out, settings, cell_timeout_s, max_rss_bytes, fresh_worker_per_cell, environment, env, warm_up)

    if devices is None:
        on_cpu = first.device == "cpu"
        runner = make_cells({**CPU_WORKER_ENV, **os.environ} if on_cpu else None, CPU_WORKER_WARM_UP if on_cpu else ())
        try:
            for spec in pending:
                if on_start is not None:
                    on_start(spec)
                record(runner.result(spec))
        finally:
            runner.close()
    else:
        _on_devices(pending, list(devices), make_cells, record, on_start, run.notes)
    run.results = [done[spec.key()] if spec.key() in done else measured[spec.key()] for spec in cells]
    run.resumed = len(cells) - len(pending)
    if not environment.written and measured:  # every new cell was skipped
        from fusedce_profiler.instrument.environment import collect_environment

        _write_environment(out / store.ENVIRONMENT_FILE, collect_environment(), resumed=bool(done))
    return run
