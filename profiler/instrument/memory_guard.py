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


def _proportional_bytes(pid: int) -> int:
    """Process ``pid``'s proportional share of the memory it maps, in bytes (``Pss`` of
    ``/proc/PID/smaps_rollup``: each page divided by the number of processes that map it; its
    resident memory where that file is missing, 0 when gone). Summed over processes that share
    pages — a helper that forks after each chunk it fills, a pre-fork pool — it counts each page
    once; private memory alone would count a page two processes share in neither."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            line = next((line for line in fh if line.startswith("Pss:")), None)
    except FileNotFoundError:  # a kernel without it (before 4.14), or the process is gone
        return rss_bytes(pid)
    except OSError:
        return 0
    try:
        return int(line.split()[1]) * 1024 if line else 0  # kB
    except (ValueError, IndexError):
        return 0


def tree_bytes(pid: int) -> int:
    """The host memory process ``pid`` and every process under it hold, in bytes: its resident
    memory (``/proc/PID/statm``, cheap however large it is), plus the proportional share of each
    descendant (:func:`_proportional_bytes`, which walks the descendant's page tables: tens of
    milliseconds for gigabytes). A child forked from ``pid`` shares ``pid``'s pages until it writes
    them, so its share of those counts a second time: the sum errs high, by at most ``pid``'s own
    resident memory, never low."""
    return rss_bytes(pid) + sum(_proportional_bytes(child) for child in descendants(pid))


def default_max_rss_bytes() -> int:
    """The memory guard a worker running the user's code gets unless told otherwise (``doctor``'s
    rule): three quarters of the machine's physical memory, so that the tool stops a runaway worker
    before the kernel's OOM killer stops anything; 64 GiB where the machine's memory cannot be read."""
    try:
        return int(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30
