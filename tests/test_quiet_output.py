"""A profiler's start or stop kept quiet: PyTorch's chatter and warnings dropped, everything else of the process —
its descriptors, its warnings filter, another thread's warnings — as it was, whatever signal lands meanwhile."""
from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

import pytest

from fusedce_profiler.instrument.tracing.quiet import quiet_third_party

pytestmark = pytest.mark.faults


def _process_output() -> tuple:
    """What a quiet block must leave as it found it: the files behind fds 1 and 2, and the warnings filter."""
    files = tuple((os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (1, 2))
    return files, list(warnings.filters)


def _profiler_like_block() -> None:
    os.write(2, b"USDT:2026-12-07 profiler_start\n")
    warnings.warn_explicit("a note for PyTorch's developers", UserWarning, "profiler.py", 1,
                           module="torch.autograd.profiler")


def test_a_signal_landing_anywhere_in_a_quiet_block_leaves_the_output_and_the_filter_as_they_were():
    """A Ctrl-C landing in the block's ``finally`` (at a call before the descriptors were put back) left fds 1 and 2 on
    deleted temporary files for the rest of the process — every later line and traceback lost — or, at the warnings
    context's exit, an ``ignore`` filter in place for good. A real SIGINT is raised at each call and return of a
    builtin in turn (where a handler runs), from the block's first call to its last."""
    with quiet_third_party():  # once first: what is done once per process (a filter's pattern compiled) is done
        _profiler_like_block()
    before = _process_output()
    points = []
    sys.setprofile(lambda frame, event, arg: points.append(event) if event in ("call", "c_return") else None)
    try:
        with quiet_third_party():
            _profiler_like_block()
    finally:
        sys.setprofile(None)
    interrupted, left = 0, []
    for point in range(len(points)):
        seen = [0]

        def land(frame, event, arg):
            if event in ("call", "c_return"):
                seen[0] += 1
                if seen[0] == point + 1:
                    sys.setprofile(None)
                    signal.raise_signal(signal.SIGINT)
        try:
            try:
                sys.setprofile(land)
                with quiet_third_party():
                    _profiler_like_block()
            finally:
                sys.setprofile(None)
            os.getpid()  # a call's return: a signal noted late is delivered here at the latest
        except KeyboardInterrupt:
            interrupted += 1
        if _process_output() != before:
            left.append(point)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # an assertion's report needs a standard error
    assert len(points) > 50 and interrupted == len(points) and not left, (len(points), interrupted, left[:10])


def test_another_threads_warnings_during_a_quiet_block_are_shown_and_pytorchs_are_not():
    """The quiet block set the process's one warnings filter to ``ignore``: a warning another thread gave meanwhile
    (the recorder's own "not recorded" notice for that thread's step included, attributed to the recorder's
    modules) was lost."""
    inside, warned = threading.Event(), threading.Event()
    shown = []

    def other_thread():
        inside.wait(10)
        warnings.warn("the other thread's warning", RuntimeWarning)
        warnings.warn_explicit("step 1 is not recorded", RuntimeWarning, "phases.py", 1,  # the recorder's notice
                               module="fusedce_profiler.instrument.recording.phases")
        warned.set()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous, warnings.showwarning = warnings.showwarning, lambda message, *args: shown.append(str(message))
        try:
            thread = threading.Thread(target=other_thread)
            thread.start()
            with quiet_third_party():
                _profiler_like_block()
                inside.set()
                assert warned.wait(10)
            thread.join(10)
        finally:
            warnings.showwarning = previous
    assert shown == ["the other thread's warning", "step 1 is not recorded"]
