"""The memory guard of a worker that runs the user's code: how much it may hold, and how much it holds."""
from __future__ import annotations

import os


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 when it cannot be read: gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def default_max_rss_bytes() -> int:
    """The memory guard a worker running the user's code gets unless told otherwise (``doctor``'s
    rule): three quarters of the machine's physical memory, so that the tool stops a runaway worker
    before the kernel's OOM killer stops anything; 64 GiB where the machine's memory cannot be read."""
    try:
        return int(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30
