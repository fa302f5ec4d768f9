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
zombie child is a stray, and waited for, only when

- it is outside the worker's process group: a job's own children stay in that group unless they
  leave it, and a daemon leaves it by design (``setsid``);
- it never ran a program of its own (the kernel's ``PF_FORKNOEXEC`` flag, kept by a zombie): a
  fork loop's generations are copies of one process, while a program a job starts in a session of
  its own (``Popen(start_new_session=True)``) has run ``exec``; and
- at least :data:`MANY` zombies are strays at once: a few daemons that double-forked leave a
  few zombies, which wait for the worker's end.

*Not waited for*, and so still able to fill the pid table within a cell's time limit: a fork loop
that never leaves the worker's group (about 3,000 zombies in 2.2 s; the run's kills take its group
whole, :func:`~fusedce_profiler.instrument.lifetime.kill_tree`), and one that runs ``exec`` at every
generation (a shell script that starts itself again). *Waited for though a job's own*: a child the
job forked without ``exec`` that left the group and exited while :data:`MANY` strays were waiting;
the job's own wait for it then finds none.

Everything the watcher calls is bound when this module is imported, before any job's code runs: a
back-end that replaces ``os.waitid``, ``os.waitpid``, ``open``, or this module's functions or
constants, does not blind it; nor does one that ends the worker's main thread (the orphans then go to
another thread, whose list it reads).

Public API: :data:`MANY`, :func:`wait_for_strays`, :func:`watch_strays`.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from fusedce_profiler.instrument.proctable import stat_fields

MANY = 256
"""Exited strays a worker holds before it waits for them (at most this many zombies stay)."""

_PERIOD_S = 0.1  # how often it asks whether a child has exited (one system call)


_FORKED_NOT_EXECUTED = 0x40  # PF_FORKNOEXEC in /proc/PID/stat's flags: forked, never ran exec


def _stray(pid: int, group: int, fields=stat_fields) -> bool:
    """Whether ``pid`` is a zombie outside process group ``group`` that never ran ``exec`` (from
    ``/proc/PID/stat``: the state, the group and the kernel's flags)."""
    found = fields(pid)
    try:
        return found[0] == b"Z" and int(found[2]) != group and bool(int(found[6]) & _FORKED_NOT_EXECUTED)
    except (TypeError, ValueError, IndexError):  # gone (None), or not the fields of proc(5)
        return False


def _adopted_or_main_threads(getpid=os.getpid, open=open, listdir=os.listdir, fields=stat_fields) -> list[int]:
    """The children listed under this process's main thread: every process it adopted (the kernel
    hands an orphan to a subreaper's first living thread) and those the main thread forked. Once the
    main thread has ended (a job called ``pthread_exit`` in it; the process shows as a zombie while
    its other threads run), adopted orphans go to another thread: then every thread's list."""
    pid = getpid()
    threads = [pid]
    if (fields(pid) or (b"",))[0] == b"Z":
        try:
            threads = [int(tid) for tid in listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            pass
    children = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                children += [int(child) for child in fh.read().split()]
        except (OSError, ValueError):
            continue
    return children


def wait_for_strays(group: int, listed=_adopted_or_main_threads, stray=_stray, waitpid=os.waitpid,
                    no_hang=os.WNOHANG, many=MANY) -> None:
    """Wait for this process's strays (zombie children outside process group ``group`` that never
    ran ``exec``) when there are at least :data:`MANY` of them (see the module docstring)."""
    strays = [pid for pid in listed() if stray(pid, group)]
    if len(strays) < many:
        return
    for pid in strays:
        try:
            waitpid(pid, no_hang)
        except ChildProcessError:  # a job's own wait took it first
            pass


def _a_child_exited(waitid=getattr(os, "waitid", None), every=getattr(os, "P_ALL", 0),
                    flags=getattr(os, "WEXITED", 0) | os.WNOHANG | getattr(os, "WNOWAIT", 0)) -> bool:
    """Whether a child of this process is a zombie, without waiting for it (one system call; Linux's)."""
    try:
        return waitid(every, 0, flags) is not None
    except ChildProcessError:
        return False


def watch_strays() -> None:
    """Start a thread that waits for this worker's strays as :func:`wait_for_strays` says, every
    0.1 s that a child of it has exited. Linux only (where a worker adopts); elsewhere nothing."""
    if sys.platform != "linux":
        return
    group = os.getpgrp()

    def watch(sleep=time.sleep, exited=_a_child_exited, wait=wait_for_strays, period=_PERIOD_S) -> None:
        while True:
            sleep(period)
            if exited():
                wait(group)

    threading.Thread(target=watch, name="stray-reaper", daemon=True).start()
