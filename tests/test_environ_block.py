"""The mark search reads a process's environment block in bounded pieces: a job that names gigabytes
of the zero page as its environment costs the reading command nothing."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tracemalloc

import pytest

from fusedce_profiler.instrument import environ_block

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("piece", [3, 7, 1 << 16])
@pytest.mark.parametrize("block, found", [
    (b"FUSEDCE_WORKER_MARK=ab\0A=1\0", True),        # first
    (b"A=1\0FUSEDCE_WORKER_MARK=ab\0B=2\0", True),    # between
    (b"A=1\0FUSEDCE_WORKER_MARK=ab", True),           # last, without its NUL
    (b"A=1\0FUSEDCE_WORKER_MARK=abc\0", False),       # a longer value
    (b"A=1\0XFUSEDCE_WORKER_MARK=ab\0", False),       # a longer name
    (b"", False),
])
def test_a_whole_entry_is_found_wherever_the_pieces_cut_it(monkeypatch, piece, block, found):
    monkeypatch.setattr(environ_block, "PIECE_BYTES", piece)
    assert environ_block.block_holds(io.BytesIO(block), b"FUSEDCE_WORKER_MARK=ab") is found


def test_an_endless_block_is_searched_to_its_limit_in_bounded_memory():
    """``/dev/zero`` stands for a block of gigabytes of NULs (the zero page a process may name as its
    environment): read whole and split, each reading cost about nine times its size."""
    class Counted(io.RawIOBase):
        def __init__(self, raw):
            self.raw, self.bytes_read = raw, 0

        def read(self, size=-1):
            piece = self.raw.read(size)
            self.bytes_read += len(piece)
            return piece

    tracemalloc.start()
    try:
        with open("/dev/zero", "rb", buffering=0) as zeros:
            counted = Counted(zeros)
            assert environ_block.block_holds(counted, b"FUSEDCE_WORKER_MARK=ab") is False
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counted.bytes_read == environ_block.MOST_BYTES
    assert peak < 4 * environ_block.PIECE_BYTES


def test_the_environment_of_a_live_process_is_read_by_pid(tmp_path):
    env = {**os.environ, "FUSEDCE_WORKER_MARK": "probe-mark"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; print(1, flush=True); sys.stdin.read()"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline()  # exec'd: before, /proc/PID/environ is still this process's
        assert environ_block.holds_entry(child.pid, b"FUSEDCE_WORKER_MARK=probe-mark")
        assert not environ_block.holds_entry(child.pid, b"FUSEDCE_WORKER_MARK=probe")
    finally:
        child.communicate(b"")
