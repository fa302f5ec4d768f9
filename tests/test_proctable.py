"""The process table's reads: a stop signal sent and not yet acted on counts as stopped."""
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from fusedce_profiler.instrument.proctable import stopped

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _proc(state: str, **masks: int):
    """An ``open`` serving ``/proc/PID/stat`` in ``state`` and ``/proc/PID/status`` with ``masks``."""
    def fake_open(path, mode="r"):
        if path.endswith("/stat"):
            return io.BytesIO(f"7 (python) {state} 1 7 7 0 -1".encode())
        names = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        lines = "".join(f"{name}:\t{masks.get(name, 0):016x}\n" for name in names)
        return io.StringIO(f"Name:\tpython\n{lines}")
    return fake_open


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


@pytest.mark.parametrize("state,masks,expected", [
    ("S", {}, False),
    ("T", {}, True),
    ("t", {}, True),
    ("S", {"ShdPnd": _bit(signal.SIGSTOP)}, True),  # sent with kill(), not yet acted on: a loaded machine
    ("S", {"SigPnd": _bit(signal.SIGSTOP), "SigCgt": _bit(signal.SIGSTOP)}, True),  # nothing catches SIGSTOP
    ("S", {"ShdPnd": _bit(signal.SIGTSTP)}, True),
    ("S", {"ShdPnd": _bit(signal.SIGTSTP), "SigCgt": _bit(signal.SIGTSTP)}, False),  # a handler runs instead
    ("S", {"ShdPnd": _bit(signal.SIGTTIN), "SigIgn": _bit(signal.SIGTTIN)}, False),
    ("S", {"ShdPnd": _bit(signal.SIGTTOU), "SigBlk": _bit(signal.SIGTTOU)}, False),
    ("S", {"ShdPnd": _bit(signal.SIGTERM)}, False),
    ("Z", {}, False),
])
def test_a_process_is_stopped_once_a_stop_signal_it_cannot_refuse_is_pending(state, masks, expected):
    assert stopped(7, open=_proc(state, **masks)) is expected


def test_a_real_process_stopped_and_continued():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not stopped(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGCONT)
        while stopped(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not stopped(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not stopped(sleeper.pid)  # gone
