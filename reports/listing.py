"""How much of a stored list a page lists: the first :data:`MAX_LISTED` items, the rest counted in one line.

A record within its size limit can hold far more items (checks, notes, causes, calibrations) than its
command writes or a page can show; the ``doctor`` and ``explain`` pages list the first ones and say how
many they left out, so their size and time do not grow with what the file holds (the record keeps
every item).
"""
from __future__ import annotations

from typing import Sequence, Sized, TypeVar

T = TypeVar("T")

MAX_LISTED = 200
"""Items of one stored list shown on a page (above what the commands write: doctor's 21 checks,
explain's 48 calibrations at the user's card — 12 families, two back-ends, two batch sizes)."""


def listed(items: Sequence[T], what: str, source: str) -> tuple[list[T], list[str]]:
    """The first :data:`MAX_LISTED` of ``items``, and the Markdown lines (none, or one and a blank)
    counting the rest: ``what`` names them (``"checks"``), ``source`` the file that keeps them."""
    shown = list(items[:MAX_LISTED])
    if len(items) <= MAX_LISTED:
        return shown, []
    return shown, [f"Showing {MAX_LISTED:,} of {len(items):,} {what}; {len(items) - MAX_LISTED:,} more are in "
                   f"{source}, not shown.", ""]


def and_more(items: Sized, shown: Sized, noun: str = "") -> str:
    """``" and N more"`` (``" and N more {noun}"``) for the ``items`` a sentence leaves out after naming
    ``shown`` (:func:`listed`'s first part); ``""`` when it names them all."""
    left = len(items) - len(shown)
    return f" and {left:,} more{f' {noun}' if noun else ''}" if left > 0 else ""
