"""Text for people: a message shortened for a one-line terminal display, never mid-word, and
control characters made visible.

Stored messages (results, logs, reports) are kept whole; only a line printed on the
terminal is shortened, at a word boundary, with "…" where something was left out.
A message comes from the user's code or from a folder someone sent: an escape sequence in it
would set the terminal's title, clear the screen or hide text when printed or when a report
is shown with ``cat``; :func:`printable` spells every control character out instead.

Public API: :func:`shorten`, :func:`count`, :func:`printable`.
"""
from __future__ import annotations

import re

ELLIPSIS = "…"

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but the newline and the tab, DEL, and C1 controls (``\x9b`` starts a sequence too)."""


def printable(text: str) -> str:
    """``text`` with every control character but the newline and the tab written as ``\\xNN``
    (``"\x1b[2J"`` → ``"\\x1b[2J"``), so a terminal or a viewer shows it instead of obeying it."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


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
