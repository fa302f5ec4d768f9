"""Running a test body in P processes of a gloo process group on the CPU.

:func:`run_world` starts ``world_size`` processes with ``torch.multiprocessing`` (spawn),
each calling ``fn(rank, world_size, *args)`` inside an initialised gloo group on a free
local port, and waits for them with a deadline: a process that raises fails the test with
its traceback (every failed rank's is shown), the others are terminated (so a rank waiting in a collective for a
rank that failed never hangs the suite), and after ``timeout_s`` every process left is
killed and the test fails. Nothing outlives the call. Process-group set-up has its own
timeout (``collective_timeout_s``): a collective that never completes raises in the
rank instead of waiting forever.

A rank that has run ``fn`` and the closing barrier writes a marker file, destroys its
groups and leaves with ``os._exit(0)``, skipping interpreter finalisation: gloo's worker
threads can abort the process while the interpreter is torn down ("terminate called
without an active exception", SIGABRT), after every check has passed. If that abort still
happens in ``destroy_process_group``, the marker shows that the rank's checks all passed,
and the world is judged on the markers; a rank that died without its marker fails the test.
"""
from __future__ import annotations

import datetime
import os
import pathlib
import pickle
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marker(done_dir: str, rank: int) -> pathlib.Path:
    return pathlib.Path(done_dir) / f"rank-{rank}-passed"


def _entry(rank: int, world_size: int, port: int, collective_timeout_s: float, done_dir: str, fn, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout_s))
    try:
        fn(rank, world_size, *args)
        dist.barrier()
        _marker(done_dir, rank).touch()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _failure_report(name: str, processes, error_files: list[str], done_dir: str) -> str:
    """Every failed rank's traceback (a rank that raised) or exit code (one that died): the
    rank that failed first is often not the first to exit, as the others then fail in a
    collective, so all are shown. The other ranks get 2 s to exit on their own first."""
    time.sleep(2.0)
    lines = [f"{name} failed:"]
    for rank, process in enumerate(processes):
        code = process.exitcode
        if code in (None, 0) or _marker(done_dir, rank).exists():
            continue
        try:
            with open(error_files[rank], "rb") as fh:
                lines.append(f"--- rank {rank} raised:\n{pickle.load(fh)}")
        except (OSError, EOFError, pickle.UnpicklingError):
            lines.append(f"--- rank {rank} exited with code {code} (a negative code is a signal)")
    return "\n".join(lines)


def run_world(fn, world_size: int, *args, timeout_s: float = 60.0, collective_timeout_s: float = 30.0) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; raise if any fails
    or if they are not all done within ``timeout_s`` seconds (then all are killed)."""
    env = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="fusedce-world-") as done_dir:
        try:
            context = mp.start_processes(
                _entry, args=(world_size, free_port(), collective_timeout_s, done_dir, fn, args),
                nprocs=world_size, join=False, start_method="spawn")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        deadline = time.monotonic() + timeout_s
        processes = context.processes
        try:
            while True:
                codes = [p.exitcode for p in processes]
                failed = [r for r, code in enumerate(codes) if code not in (None, 0)
                          and not _marker(done_dir, r).exists()]
                if failed:
                    raise AssertionError(_failure_report(fn.__name__, processes, context.error_files, done_dir))
                if all(code is not None for code in codes):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s:g} s on {world_size} processes")
                time.sleep(0.2)
            missing = [r for r in range(world_size) if not _marker(done_dir, r).exists()]
            assert not missing, f"ranks {missing} of {fn.__name__} exited without passing their checks"
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                process.join(timeout=10)
