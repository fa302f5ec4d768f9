"""A recorder's ``steps`` and ``out``, checked before anything is made (``ValueError`` naming the argument):
:class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder` and the training callbacks share them."""
from __future__ import annotations

import itertools
import os
from numbers import Integral
from typing import Iterable

from fusedce_profiler.instrument import capacity, store


def checked_steps(steps: Iterable[int]) -> frozenset[int]:
    """``steps`` (0-based step indices) as a set; ``ValueError`` naming ``steps`` for anything else, and for
    more than a folder holds — counted as they come, so an endless iterable is refused, never listed."""
    listed = None
    if isinstance(steps, Iterable) and not isinstance(steps, (str, bytes)):
        listed = list(itertools.islice(iter(steps), capacity.MAX_RECORDED_STEPS + 1))
    if listed is None or not all(isinstance(s, Integral) and not isinstance(s, bool) for s in listed):
        raise ValueError(f"steps must be 0-based step indices (integers ≥ 0), got {steps!r:.80}")
    if len(listed) > capacity.MAX_RECORDED_STEPS:
        raise ValueError(f"steps: more than the {capacity.MAX_RECORDED_STEPS:,} a folder holds "
                         f"(one line each of {store.RECORDED_STEPS_FILE})")
    if any(s < 0 for s in listed):
        raise ValueError(f"steps must be 0-based step indices (≥ 0), got {sorted(listed)[:8]}")
    return frozenset(int(s) for s in listed)


def checked_out(out: str | os.PathLike) -> str:
    """``out`` as a path string; ``ValueError`` naming ``out`` for what names no folder (not a path, blank,
    a NUL character, a character the file system's encoding cannot write: a lone surrogate that no
    undecodable byte stands for)."""
    text = os.fspath(out) if isinstance(out, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"out: expected a folder path, got {out!r:.60}")
    if "\x00" in text:
        raise ValueError(f"out: a path cannot hold a NUL character, got {out!r:.60}")
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:
        raise ValueError(f"out: a path cannot hold {text[exc.start]!r} (not a character the file system's "
                         f"encoding writes), got {out!r:.60}") from None
    return text
