"""Keep third-party chatter out of the user's output while a profiler starts or stops.

PyTorch's profiler back-end writes lines such as ``USDT:… profiler_start`` straight to the
process's file descriptors (C++, not Python's ``sys.stderr``), and starting or stopping a
trace can raise Python warnings meant for PyTorch's developers. Inside the user's own training
run those lines are noise. :func:`quiet_third_party` captures file descriptors 1 and 2 around
such a call, writes back every line that is not chatter, and ignores the warnings attributed to
PyTorch's modules or this package's profiler calls (:data:`QUIET_MODULES`): another thread's own warnings
meanwhile are shown as ever (the filter list is the process's one: a plain ``ignore`` would drop them; a
``catch_warnings`` another thread enters and leaves across the block may keep this narrow filter, as
Python's warnings are not thread-safe).
Only the start and the stop are wrapped, never the user's step (:func:`start_profiler` spends the
allocator's one warning at the start).

The whole of it runs with the main thread's signals held back (:mod:`.deferred_signals`): a
handler's exception (Ctrl-C) landing as the descriptors are put back would leave them on the
captures, every later line of the process written into deleted files, or the filter in place for
good. A signal that came meanwhile is delivered once everything is back.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings

from fusedce_profiler.instrument import deferred_signals

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


QUIET_MODULES = r"(torch|fusedce_profiler\.instrument\.(tracing|protocol|snapshot))(\.|$)"
"""The modules (a regular expression, as :func:`warnings.filterwarnings` takes it) whose warnings a quiet block
ignores: PyTorch's, and this package's modules that start and stop its profiler (a warning PyTorch raises with
``stacklevel`` lands there). Not the recorder's: its notices, another thread's meanwhile, are the user's."""


@contextlib.contextmanager
def quiet_third_party():
    """Run the block with fds 1 and 2 captured and PyTorch's warnings ignored; afterwards write
    back what was captured, less the lines starting with one of :data:`CHATTER`."""
    with deferred_signals.deferred(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=QUIET_MODULES)
        _flush()
        saved: list[int] = []
        try:
            captures = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
            saved += [os.dup(1)]
            saved += [os.dup(2)]
        except OSError:  # nowhere to capture (no temporary folder; no descriptors: an embedded interpreter)
            for original in saved:
                os.close(original)
            yield  # stay out of the way (a capture made is closed when collected)
            return
        try:
            for fd, capture in zip((1, 2), captures):
                os.dup2(capture.fileno(), fd)
            yield
        finally:
            _flush()
            for fd, original in zip((1, 2), saved):
                os.dup2(original, fd)
                os.close(original)
            for fd, capture in zip((1, 2), captures):
                with contextlib.suppress(OSError):  # a line lost to a full disk is not the user's step's failure
                    capture.seek(0)
                    kept = _keep(capture.read())
                    if kept:
                        os.write(fd, kept)
                capture.close()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
