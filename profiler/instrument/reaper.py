"""The worker's reaper: a forked process that ends what the worker started when the worker's
parent dies (``kill -9``, the OOM killer), and scrubs the worker's log as the parent would have
(:mod:`~fusedce_profiler.instrument.lifetime` tells how it fits with the worker's other ways to end).

Public API: :func:`start_reaper`.
"""
from __future__ import annotations

import os
import signal
import time

from fusedce_profiler.instrument.lifetime import command_of, end_stopped_template, kill_marked, kill_tree, own_mark
from fusedce_profiler.instrument.proctable import lives, signal_quietly, started
from fusedce_profiler.instrument.worker_log import log_of_stdout, scrub_log


def _scrub_after(worker: int, log: str | None) -> None:
    """The reaper's scrub of the worker's ``log``: when its lock is not given up (the worker, stuck
    or its job's code, holds it), the worker is killed — a scrub takes milliseconds, not the seconds
    waited — and the log scrubbed once the worker's descriptors are closed."""
    if scrub_log(log):
        return
    signal_quietly(os.kill, worker)
    deadline = time.monotonic() + 5.0
    while lives(worker) and time.monotonic() < deadline:
        time.sleep(0.01)
    scrub_log(log)


def start_reaper(life_fd: int) -> int:
    """Fork the reaper: it waits for the parent's end of the life pipe to close, then kills every
    process under the worker and the worker's process group, and scrubs the worker's log as the
    parent would have. Forked before anything is imported or threaded. Returns its pid.

    It wakes only when the parent died (``kill -9``, the OOM killer): a parent that closes a worker
    kills the worker's group, the reaper with it, before it closes the pipe, and scrubs the log
    itself. After a parent's death the worker, ending, scrubs the log too
    (:func:`~fusedce_profiler.instrument.lifetime.end_worker`): it may kill the group, this reaper
    included, first."""
    worker, parent = os.getpid(), os.getppid()
    command = command_of(parent)  # a forked worker's template's parent, read before any job ran
    pid = os.fork()
    if pid == 0:
        try:
            log = log_of_stdout()
            os.closerange(0, life_fd)
            os.closerange(life_fd + 1, 1 << 16)
            while os.read(life_fd, 1):
                pass
            end_stopped_template(parent, command)  # before the walk, which stops what it finds (and may stop it too)
            kill_tree(worker, spare=os.getpid())
            if own_mark():
                kill_marked(own_mark(), spare={worker}, since=started(worker))
            _scrub_after(worker, log)  # the run folder a user attaches names no machine path, even after a kill -9
        finally:
            os.killpg(0, signal.SIGKILL)
            os._exit(0)
    os.close(life_fd)
    return pid
