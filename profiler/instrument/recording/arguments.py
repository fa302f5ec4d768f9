"""A recorder's ``steps``, ``out`` and what it is told of the model, checked before anything is made
(``ValueError`` naming the argument): :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`
and the training callbacks share them. A value its own report would refuse is refused here: a step
recorded with it would be lost to that report."""
from __future__ import annotations

import itertools
import os
from numbers import Integral
from typing import Iterable

from fusedce_profiler.instrument import capacity, store
from fusedce_profiler.instrument.text import shown


MAX_STEP = 2**63 - 1
"""The largest step index (a 64-bit counter's; a larger one no loop reaches)."""


def checked_steps(steps: Iterable[int]) -> frozenset[int]:
    """``steps`` (0-based step indices) as a set; ``ValueError`` naming ``steps`` for anything else, and for
    more than a folder holds — counted as they come, so an endless iterable is refused, never listed."""
    listed = None
    if isinstance(steps, Iterable) and not isinstance(steps, (str, bytes)):
        try:  # a 0-d array or tensor says it is iterable, then refuses; a user's iterable may raise anything
            listed = list(itertools.islice(iter(steps), capacity.MAX_RECORDED_STEPS + 1))
        except Exception:  # noqa: BLE001 - any failure of the caller's iterable is this argument's
            listed = None
    if listed is None or not all(isinstance(s, Integral) and not isinstance(s, bool) for s in listed):
        raise ValueError(f"steps must be 0-based step indices (integers ≥ 0), got {steps!r:.80}")
    if len(listed) > capacity.MAX_RECORDED_STEPS:
        raise ValueError(f"steps: more than the {capacity.MAX_RECORDED_STEPS:,} a folder holds "
                         f"(one line each of {store.RECORDED_STEPS_FILE})")
    if any(s < 0 or s > MAX_STEP for s in listed):
        raise ValueError(f"steps must be 0-based step indices (0 to 2⁶³ − 1), got {sorted(listed)[:8]}")
    if not listed:
        raise ValueError("steps: give at least one step index (none would record nothing, without a word)")
    return frozenset(int(s) for s in listed)


def checked_flags(*, trace: object = True, snapshot: object = True, force: object = False, append: object = False
                  ) -> tuple[bool, bool]:
    """``(trace, snapshot)`` once all four are ``True`` or ``False`` (a string is refused, never read by
    its truth) and ``force`` (replace the recording in the folder) and ``append`` (add to it) are not
    both asked; ``ValueError`` naming the argument."""
    for name, value in (("trace", trace), ("snapshot", snapshot), ("force", force), ("append", append)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} {shown(value)}: expected True or False")  # the commands' flags' wording
    if force and append:
        raise ValueError("force and append contradict each other: force replaces the recording in out, append "
                         "adds to it; choose one")
    return trace, snapshot


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


MAX_LABEL_CHARS = 500
"""The longest ``label`` (it names the run in the report's tables and plot legends)."""


def checked_subject(label: str, fused: bool | None, head: str | None, vocab: int | None, batch: int | None,
                    seq: int | None) -> tuple:
    """``(label, fused, head, vocab, batch, seq)`` as given, once each is of its kind: ``label`` a line
    of at most :data:`MAX_LABEL_CHARS` printable characters; ``fused`` ``True``, ``False`` or ``None``;
    ``head`` an attribute path or ``None``; ``vocab``, ``batch``, ``seq`` integers ≥ 1 or ``None``."""
    if not isinstance(label, str) or not label.isprintable() or len(label) > MAX_LABEL_CHARS:
        raise ValueError(f"label: expected a line of at most {MAX_LABEL_CHARS} printable characters, got {label!r:.60}")
    if fused is not None and not isinstance(fused, bool):
        raise ValueError(f"fused: expected True, False or None, got {fused!r:.60}")
    if head is not None and (not isinstance(head, str) or not head.strip() or not head.isprintable()):
        raise ValueError(f"head: expected the LM head's attribute path (e.g. 'lm_head'), got {head!r:.60}")
    for name, value in (("vocab", vocab), ("batch", batch), ("seq", seq)):
        if value is not None and (not isinstance(value, Integral) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name}: expected an integer ≥ 1 or None, got {value!r:.60}")
    return label, fused, head, vocab, batch, seq
