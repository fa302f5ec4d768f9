"""The memory guard of a worker that runs the user's code: how much it may hold, and how much it
holds — the worker and every process under it, and every process its jobs made a child of the
worker's parent (``clone(CLONE_PARENT)``), known by the worker's mark. A helper the user's code
starts counts as the worker's memory: a limit that read the worker alone let a loss hold 2 GiB in a
child under a 1 GiB limit.

What it cannot see: memory no process maps (a ``memfd`` or ``/dev/shm`` file left unmapped, page
tables), and a helper that clears its environment and leaves the tree. Only a cgroup's
``memory.max`` counts those; the guard is there to stop runaway user code, not an adversary who
plans for it."""
from __future__ import annotations

import os
import time

from fusedce_profiler.instrument.environ_block import holds_entry
from fusedce_profiler.instrument.lifetime import MARK_VARIABLE
from fusedce_profiler.instrument.proctable import children_of, descendants, parent_of, started

SLOW_READING_S = 0.02
"""A process whose proportional share took longer than this to read is read by its resident memory
from then on (:class:`TreeMeter`): a job that maps a vast range of the zero page makes every
``smaps_rollup`` walk seconds long, and the guard would be blind for as long."""


SIBLING_SCAN_S = 0.02
"""The longest a reading spends reading environments of processes beside the worker not read before."""


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


class TreeMeter:
    """The host memory of worker ``pid`` with every process of its (see the module docstring), in
    bytes: the worker's resident memory (``/proc/PID/statm``, cheap however large it is), plus each
    other process's proportional share (:func:`_proportional_bytes`), or its resident memory once
    that took longer than :data:`SLOW_READING_S` to read. A child forked from the worker shares the
    worker's pages until it writes them, so its share of those counts a second time, and a process
    read by its resident memory counts every page it shares whole: the sum errs high, never low."""

    def __init__(self, pid: int, mark: str | None = None) -> None:
        self.pid, self._entry = pid, None if mark is None else f"{MARK_VARIABLE}={mark}".encode()
        self._slow: set[int] = set()  # read by their resident memory
        self._marks: dict[tuple[int, int], bool] = {}  # (pid, start) -> bears the mark

    def _marked_siblings(self) -> list[int]:
        """The other children of the worker's parent that bear the worker's mark. Each one's environment
        is read once (a process is known by its pid and start time), the largest unread ones first, for
        at most :data:`SIBLING_SCAN_S` a reading: hundreds of idle helpers with long environments cannot
        make a reading slow, nor hide a large helper behind them."""
        if self._entry is None:
            return []
        parent = parent_of(self.pid)
        if not parent:  # gone
            return []
        keys = [(pid, started(pid)) for pid in children_of(parent) if pid != self.pid]
        self._marks = {key: self._marks[key] for key in keys if key in self._marks}  # the gone are forgotten
        unread = sorted((key for key in keys if key not in self._marks and key[1] is not None),
                        key=lambda key: rss_bytes(key[0]), reverse=True)
        began = time.monotonic()
        for key in unread:
            if time.monotonic() - began > SIBLING_SCAN_S:
                break
            try:
                self._marks[key] = holds_entry(key[0], self._entry)
            except OSError:
                continue
        return [pid for (pid, start), marked in self._marks.items() if marked]

    def _share(self, pid: int) -> int:
        if pid in self._slow:
            return rss_bytes(pid)
        began = time.monotonic()
        share = _proportional_bytes(pid)
        if time.monotonic() - began > SLOW_READING_S:
            self._slow.add(pid)
        return share

    def __call__(self) -> int:
        others = descendants(self.pid)
        for sibling in self._marked_siblings():
            others += [sibling, *descendants(sibling)]
        return rss_bytes(self.pid) + sum(self._share(pid) for pid in others)


def default_max_rss_bytes() -> int:
    """The memory guard a worker running the user's code gets unless told otherwise (``doctor``'s
    rule): three quarters of the machine's physical memory, so that the tool stops a runaway worker
    before the kernel's OOM killer stops anything; 64 GiB where the machine's memory cannot be read."""
    try:
        return int(0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 64 * 2**30
