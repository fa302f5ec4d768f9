"""Stored strings made safe for the places a report puts them.

A run folder is something users receive from others, and its strings are the user's:
back-end names (``module:callable``), config names, paths, error messages. Every one of
them goes through a function of this module before it enters a Markdown page or a plot;
the HTML page escapes with :func:`html.escape` (:mod:`fusedce_reports.html`). A page shows at
most :data:`~fusedce_profiler.instrument.text.MAX_SHOWN_CHARS` characters of a line of a stored
string (:func:`~fusedce_profiler.instrument.text.capped`); the record keeps it whole.

- :func:`markdown_text`: plain text shown as itself in Markdown prose, headings, captions
  and table cells: metacharacters backslash-escaped, ``&``, ``<`` and ``>`` as entities
  (so no raw HTML tag survives), one line.
- :class:`Markdown`: a string that already is Markdown (a deliberate code span or bold);
  :func:`fusedce_reports.markdown.markdown_table` passes it through unchanged.
- :func:`link_target`: a relative path as the target of a Markdown link or image.
- :func:`code_block`: lines in a fenced block whose fence no line can close.
- :func:`plot_text`: a label for matplotlib, which reads ``$…$`` as mathematics.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from fusedce_profiler.instrument.text import capped

_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ALWAYS = set("\\`*[]|~$#")
_LINE_START = re.compile(r"^([-+=]|\d+[.)])")
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


class Markdown(str):
    """Text that already is Markdown: written into a page as it is, never escaped."""


def _word(char: str) -> bool:
    return char.isalnum()


def markdown_text(value: object, *, line_start: bool = True) -> str:
    """``value`` as one line of Markdown that renders as exactly its text.

    ``\\ ` * [ ] | ~ $ #`` are backslash-escaped, ``_`` too unless it is inside a word
    (``scaled_loss`` cannot start emphasis and stays readable), ``& < >`` become entities.
    Newlines become spaces; a text longer than
    :data:`~fusedce_profiler.instrument.text.MAX_SHOWN_CHARS` is cut there (:func:`capped`).
    With ``line_start`` (prose that may begin a line: a list item, a heading) a leading ``-``,
    ``+``, ``=`` or ``1.`` is escaped as well; table cells do not need it. A :class:`Markdown`
    value is returned unchanged.
    """
    if isinstance(value, Markdown):
        return value
    text = capped(_NEWLINES.sub(" ", str(value)).strip())
    out = []
    for i, char in enumerate(text):
        if char in _ENTITIES:
            out.append(_ENTITIES[char])
        elif char in _ALWAYS:
            out.append("\\" + char)
        elif char == "_" and not (0 < i < len(text) - 1 and _word(text[i - 1]) and _word(text[i + 1])):
            out.append("\\_")
        else:
            out.append(char)
    escaped = "".join(out)
    if line_start:
        escaped = _LINE_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], escaped)
    return escaped


def link_target(path: str) -> str:
    """A relative POSIX path as a link target: percent-encoded, so that spaces, parentheses
    and brackets in a file name cannot end the link."""
    return quote(path, safe="/-_.~")


def code_block(lines: Iterable[str], info: str = "text") -> list[str]:
    """``lines`` fenced as a code block (shown verbatim): the fence is one backtick longer
    than the longest run of backticks in the lines, so no stored line can close it; a line too
    long to show is cut (:func:`capped`)."""
    body = [capped(str(line)) for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


def plot_text(value: object) -> str:
    """``value`` as a matplotlib label: control and invisible characters spelled out
    (:func:`~fusedce_profiler.instrument.text.printable`: matplotlib warns of a glyph it lacks by
    printing the character itself to the terminal), and dollar signs escaped, so a name holding two
    of them is drawn as written instead of being parsed (or failing to parse) as mathtext."""
    from fusedce_profiler.instrument.text import printable

    return printable(str(value)).replace("$", r"\$")
