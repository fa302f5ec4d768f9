"""The exited processes a worker adopted: waited for once they pile up.

A worker is a child subreaper (:func:`~fusedce_profiler.instrument.lifetime.adopt_orphans`): a
process a job started whose parent exits becomes the worker's child. Nobody else waits for such a
*stray*, so once it exits it stays a zombie holding its process id until the worker waits for it or
ends. A daemon that forks and lets its parent exit at every generation leaves one zombie a
generation: 2,000 to 3,000 a second on a two-core machine, which fills a pid space of 32,768 within
16 s, after which every fork on the machine fails with ``EAGAIN`` — the command's own included.
Watched, such a daemon's zombies peak near 400 and settle below :data:`MANY`
(``tests/test_profiler_strays.py``).

The worker cannot tell a stray from a child a job forked itself (the kernel keeps no record of a
process's first parent), and must not wait for a job's own child: the job's wait would then find
none (Python's ``subprocess`` reports exit 0, ``multiprocessing``'s ``join`` waits for ever). So a
zombie is waited for only when

- it is outside the worker's process group: a job's own children stay in that group unless they
  leave it, and a daemon leaves it by design (``setsid``); and
- at least :data:`MANY` such zombies are the worker's children at once: a job's own child that left
  the group (``Popen(start_new_session=True)``) keeps its exit status unless the job leaves that
  many unwaited.

A fork loop that never leaves the worker's group is not waited for; the run's kills take its group
whole (:func:`~fusedce_profiler.instrument.lifetime.kill_tree`).

Public API: :data:`MANY`, :func:`wait_for_strays`, :func:`watch_strays`.
"""
from __future__ import annotations

import os
import sys
import threading
import time

MANY = 256
"""Exited strays a worker holds before it waits for them (at most this many zombies stay)."""

_PERIOD_S = 0.1  # how often it asks whether a child has exited (one system call)


def _exited_outside(pid: int, group: int) -> bool:
    """Whether ``pid`` is a zombie outside process group ``group`` (from ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state, _, pgrp = fh.read().rsplit(b")", 1)[1].split()[:3]
    except (OSError, ValueError):
        return False
    return state == b"Z" and int(pgrp) != group


def _adopted_or_main_threads() -> list[int]:
    """The children listed under this process's main thread: every process it adopted (the kernel
    hands an orphan to a subreaper's first living thread) and those the main thread forked."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children", "rb") as fh:
            return [int(pid) for pid in fh.read().split()]
    except (OSError, ValueError):
        return []


def wait_for_strays(group: int) -> int:
    """Wait for this process's zombie children outside process group ``group`` when there are at
    least :data:`MANY` of them (see the module docstring). Returns how many such zombies are left."""
    strays = [pid for pid in _adopted_or_main_threads() if _exited_outside(pid, group)]
    if len(strays) < MANY:
        return len(strays)
    for pid in strays:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # a job's own wait took it first
            pass
    return 0


def _a_child_exited() -> bool:
    """Whether a child of this process is a zombie, without waiting for it (one system call)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False


def watch_strays() -> None:
    """Start a thread that waits for this worker's strays as :func:`wait_for_strays` says, every
    0.1 s that a child of it has exited. What it calls is bound now, before a job's code runs.
    Linux only (where a worker adopts); elsewhere nothing."""
    if sys.platform != "linux":
        return
    group = os.getpgrp()

    def watch(sleep=time.sleep, exited=_a_child_exited, wait=wait_for_strays) -> None:
        while True:
            sleep(_PERIOD_S)
            if exited():
                wait(group)

    threading.Thread(target=watch, name="stray-reaper", daemon=True).start()
