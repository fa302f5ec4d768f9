"""How a worker process ends with its parent, and takes what it started with it.

The worker runs in its own session; four mechanisms keep it and everything a job starts from
outliving the command (the worker module's docstring tells the whole story):

- :func:`start_reaper`: a forked *reaper* waits on the read end of a *life pipe* whose write
  end only the parent holds; when the parent dies, however, it kills the worker's process group.
- :func:`die_with_parent`: the kernel's ``PR_SET_PDEATHSIG`` (Linux), else a watchdog thread.
- :func:`adopt_orphans`: the worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a
  daemon a job starts (fork, ``setsid``, fork) becomes its child when its parent exits;
- :func:`end_children`: when the worker ends it kills every child that left its group.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    """``prctl(option, value)`` on Linux; elsewhere (or without a C library that has it) nothing."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def die_with_parent(parent_pid: int) -> None:
    """Make sure this process does not outlive ``parent_pid`` (see the module docstring)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def adopt_orphans() -> None:
    """Become a child subreaper: a process a job started that leaves this process group and loses
    its parent becomes this worker's child instead of init's (Linux; elsewhere nothing)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _children() -> set[int]:
    """This process's children (every thread's), from /proc."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            pass
    return pids


def end_children(spare: int) -> None:
    """SIGKILL every child that has left this process group (a daemon a job started, adopted
    here) and reap it; its own children are adopted in turn, so this repeats until none is left
    (at most 50 rounds). Children still in the group (a compiler's worker pool, ``spare``: the
    reaper) are left to the group's end (:meth:`~fusedce_profiler.instrument.worker.Worker.close`
    kills the group once the worker has exited)."""
    group = os.getpgrp()
    for _ in range(50):
        strays = set()
        for pid in _children() - {spare}:
            try:
                if os.getpgid(pid) != group:
                    strays.add(pid)
            except ProcessLookupError:
                pass
        if not strays:
            return
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError, PermissionError):
                pass


def start_reaper(life_fd: int) -> int:
    """Fork the reaper: it waits for the parent's end of the life pipe to close, then kills this
    process group (see the module docstring). Forked before anything is imported or threaded.
    Returns its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.closerange(0, life_fd)
            os.closerange(life_fd + 1, 1 << 16)
            while os.read(life_fd, 1):
                pass
        finally:
            os.killpg(0, signal.SIGKILL)
            os._exit(0)
    os.close(life_fd)
    return pid
