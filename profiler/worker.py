"""Worker subprocesses: each cell is measured in a separate process.

A :class:`Worker` is a ``multiprocessing`` *spawn* child (a fresh interpreter: no CUDA
context, allocator state or autotuning cache inherited) that receives cells over a pipe
and sends back :class:`~profiler.records.CellResult` JSON. Its stdout/stderr go to a log
file, whose tail becomes the message when the process dies (segfault, ``os._exit``,
a CUDA error that aborts, the kernel's OOM killer). The child ignores SIGINT so that
Ctrl-C reaches only the parent, which stops the worker and keeps its results file valid.

The runner (:mod:`profiler.runner`) replaces a worker after any ``oom`` or ``error``.

Public API: :class:`Worker`.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from profiler.records import CellResult, CellSpec


def _serve(conn, log_path: str) -> None:
    """The child's main loop: ``("cell", spec_json, settings)`` or ``("environment",)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from profiler.environment import collect_environment
    from profiler.measure import MeasureSettings, measure_cell

    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        if message[0] == "environment":
            conn.send(json.dumps(collect_environment()))
            continue
        _, spec_json, settings = message
        spec = CellSpec(**json.loads(spec_json))
        print(f"--- cell {spec_json}", flush=True)
        conn.send(measure_cell(spec, MeasureSettings(**settings)).to_json())


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.strip().splitlines() if not line.startswith("--- cell ")]
    return "\n".join(lines[-12:])[-limit:]


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "worker stopped responding"
    if code < 0:
        try:
            return f"worker killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


class Worker:
    """One spawned child process; :meth:`run` measures a cell in it."""

    def __init__(self, log_dir: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"worker-{os.getpid()}-{time.monotonic_ns()}.log"
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, str(self.log_path)), daemon=True)
        self._process.start()
        child.close()

    def _receive(self, timeout_s: float | None) -> tuple[str | None, bool]:
        """(the child's reply, or ``None`` if it died or timed out; whether it timed out)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._conn.poll(0.2):
                try:
                    return self._conn.recv(), False
                except EOFError:  # the child closed its end: it is exiting
                    self._process.join(timeout=5)
                    return None, False
            if not self._process.is_alive():
                return (self._conn.recv() if self._conn.poll(0) else None), False
            if deadline is not None and time.monotonic() > deadline:
                return None, True

    def environment(self, timeout_s: float = 300) -> dict | None:
        """The child's :func:`~profiler.environment.collect_environment` (``None`` if it died)."""
        self._conn.send(("environment",))
        reply, _ = self._receive(timeout_s)
        return json.loads(reply) if reply is not None else None

    def run(self, spec: CellSpec, settings, timeout_s: float | None = None) -> CellResult:
        """Measure ``spec`` (``settings``: a :class:`~profiler.measure.MeasureSettings`).

        A dead or timed-out child gives ``status="error"`` with the exit reason and the
        tail of its log; the caller must then :meth:`close` this worker.
        """
        self._conn.send(("cell", spec.key(), asdict(settings)))
        reply, timed_out = self._receive(timeout_s)
        if reply is not None:
            return CellResult.from_json(reply)
        self.close()
        reason = f"timed out after {timeout_s:g} s" if timed_out else _describe_exit(self._process.exitcode)
        tail = _tail(self.log_path)
        message = f"{reason}; log {self.log_path}" + (f":\n{tail}" if tail else "")
        return CellResult(spec=spec, status="error", message=message,
                          memory_source="cuda-allocator" if spec.device.startswith("cuda") else "cpu-profiler")

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._process.is_alive():
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._conn.close()
