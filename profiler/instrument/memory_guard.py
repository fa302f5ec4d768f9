"""The memory guard of a worker that runs the user's code: how much it may hold, and how much it
holds — the worker and every process under it (a helper the user's code starts counts as the
worker's memory: a limit that read the worker alone let a loss hold 2 GiB in a child under a 1 GiB
limit)."""
from __future__ import annotations

import os

from fusedce_profiler.instrument.lifetime import descendants


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 when it cannot be read: gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _private_bytes(pid: int) -> int:
    """Memory only process ``pid`` holds, in bytes (``Private_Clean`` + ``Private_Dirty`` of
    ``/proc/PID/smaps_rollup``; its resident memory where that file is missing, 0 when gone). A child
    forked from the worker shares the worker's pages until it writes them: its resident memory would
    count them twice."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            fields = dict(line.split(":", 1) for line in fh if line.startswith("Private_"))
    except FileNotFoundError:  # a kernel without it (before 4.14), or the process is gone
        return rss_bytes(pid)
    except (OSError, ValueError):
        return 0
    try:
        return sum(int(value.split()[0]) for value in fields.values()) * 1024  # kB
    except (ValueError, IndexError):
        return 0


def tree_bytes(pid: int) -> int:
    """The host memory process ``pid`` and every process under it hold, in bytes: its resident
    memory, plus the private memory of each descendant (:func:`_private_bytes`). Reads only
    ``/proc/PID/statm`` while ``pid`` has no child (the common case; the guard polls it 20 times a
    second)."""
    return rss_bytes(pid) + sum(_private_bytes(child) for child in descendants(pid))


def default_max_rss_bytes() -> int:
    """The memory guard a worker running the user's code gets unless told otherwise (``doctor``'s
    rule): three quarters of the machine's physical memory, so that the tool stops a runaway worker
    before the kernel's OOM killer stops anything; 64 GiB where the machine's memory cannot be read."""
    try:
        return int(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30
