"""Out-of-memory: one classifier for every place that turns a failure into a result.

An allocation that fails raises :class:`torch.OutOfMemoryError` on CUDA, a ``RuntimeError``
from the CPU allocator ("DefaultCPUAllocator: can't allocate memory: you tried to allocate
N bytes"), or an error of a library or of ``torch.compile`` that wraps either. A step that
ran out of memory is a measurement (``status="oom"``), not a crash.
"""
from __future__ import annotations

import re

import torch

from fusedce_profiler.instrument.callables import message_of

#: torch.OutOfMemoryError (torch >= 2.5) or its older CUDA-only name.
OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "bytes": 1}
_REQUEST_PATTERNS = (
    re.compile(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)"),
    re.compile(r"you tried to allocate (\d+) (bytes)"),
)
_MESSAGES = ("out of memory", "can't allocate memory", "you tried to allocate")


def requested_bytes(message: str) -> int | None:
    """The size of the failed allocation named in an out-of-memory message (CUDA or CPU)."""
    for pattern in _REQUEST_PATTERNS:
        match = pattern.search(message)
        if match:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


def is_out_of_memory(exc: BaseException | None) -> bool:
    """True for an allocator OOM, also when wrapped (``__cause__`` / ``__context__`` chain)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OutOfMemoryError):
            return True
        text = message_of(exc).lower()
        if any(marker in text for marker in _MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, whole (a result's message is never cut)."""
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""
