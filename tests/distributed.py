"""Running a test body in P processes of a gloo process group on the CPU.

:func:`run_world` starts ``world_size`` processes with ``torch.multiprocessing`` (spawn),
each calling ``fn(rank, world_size, *args)`` inside an initialised gloo group on a free
local port, and waits for them with a deadline: a process that raises fails the test with
its traceback, the others are terminated at once (so a rank waiting in a collective for a
rank that failed never hangs the suite), and after ``timeout_s`` every process left is
killed and the test fails. Nothing outlives the call. Process-group set-up has its own
timeout (``collective_timeout_s``): a collective that never completes raises in the
rank instead of waiting forever.
"""
from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, collective_timeout_s: float, fn, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout_s))
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(fn, world_size: int, *args, timeout_s: float = 60.0, collective_timeout_s: float = 30.0) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; raise if any fails
    or if they are not all done within ``timeout_s`` seconds (then all are killed)."""
    env = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        context = mp.start_processes(_entry, args=(world_size, free_port(), collective_timeout_s, fn, args),
                                     nprocs=world_size, join=False, start_method="spawn")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):  # raises ProcessRaisedException / ProcessExitedException
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fn.__name__} did not finish in {timeout_s:g} s on {world_size} processes")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
