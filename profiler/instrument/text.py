"""Shortening a message for a one-line terminal display, never mid-word.

Stored messages (results, logs, reports) are kept whole; only a line printed on the
terminal is shortened, at a word boundary, with "…" where something was left out.

Public API: :func:`shorten`, :func:`count`.
"""
from __future__ import annotations

ELLIPSIS = "…"


def shorten(text: str, width: int = 120) -> str:
    """The first non-blank line of ``text``, cut at the last space before ``width`` characters.

    ``"…"`` marks a cut (also when later lines were dropped). A single word longer than
    ``width`` (a path, say) is kept whole rather than cut inside.
    """
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line, more = lines[0], len(lines) > 1
    if len(line) <= width:
        return line + (f" {ELLIPSIS}" if more else "")
    cut = line.rfind(" ", 0, width)
    if cut <= 0:  # one long word: keep it whole
        cut = line.find(" ")
        if cut < 0:
            return line + (f" {ELLIPSIS}" if more else "")
    return line[:cut].rstrip(" ,;:") + ELLIPSIS


def count(n: int, noun: str) -> str:
    """``"1 cell"``, ``"0 cells"``, ``"12 cells"`` (``noun`` in the singular, plural with an s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
