"""Keep third-party chatter out of the user's output while a profiler starts or stops.

PyTorch's profiler back-end writes lines such as ``USDT:… profiler_start`` straight to the
process's file descriptors (C++, not Python's ``sys.stderr``), and starting or stopping a
trace can raise Python warnings meant for PyTorch's developers. Inside the user's own training
run those lines are noise. :func:`quiet_third_party` captures file descriptors 1 and 2 around
such a call, writes back every line that is not chatter, and silences Python warnings raised
inside it. Only the start and the stop are wrapped, never the user's step (:func:`start_profiler`
spends the allocator's one warning at the start).
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings

#: Fragments of third-party lines: the profiler back-end's own log (``USDT:2026-…
#: profiler_start``) and the CPU allocator's once-per-process warning about a block allocated
#: before profiling began (:func:`prime_allocator_warning` makes it happen under capture).
CHATTER = (b"USDT:", b"allocated before the profiling started")


def _keep(captured: bytes) -> bytes:
    return b"".join(line for line in captured.splitlines(keepends=True) if not any(c in line for c in CHATTER))


def start_profiler(profiler) -> None:
    """``profiler.__enter__()`` without chatter. A block allocated before the start and freed
    after it makes PyTorch's CPU allocator warn, once per process; freeing one here, under
    capture, spends that warning where the user never sees it."""
    import torch

    with quiet_third_party():
        primer = torch.empty(16)
        profiler.__enter__()
        del primer


@contextlib.contextmanager
def quiet_third_party():
    """Run the block with fds 1 and 2 captured and Python warnings ignored; afterwards write
    back what was captured, less the lines starting with one of :data:`CHATTER`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no file descriptors to capture (an embedded interpreter): stay out of the way
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        return
    captures = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    try:
        for fd, capture in zip((1, 2), captures):
            os.dup2(capture.fileno(), fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, original, capture in zip((1, 2), saved, captures):
            os.dup2(original, fd)
            os.close(original)
            capture.seek(0)
            kept = _keep(capture.read())
            capture.close()
            if kept:
                os.write(fd, kept)
