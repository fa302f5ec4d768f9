"""Text for people: a message shortened for a one-line terminal display, never mid-word, and
control characters made visible.

Stored messages (results, logs) are kept whole; a line printed on the terminal is shortened, at
a word boundary, with "…" where something was left out, and no line of a stored string that a
report or the terminal shows is longer than :data:`MAX_SHOWN_CHARS` (:func:`capped`): a folder
someone sent may hold messages of megabytes, and a report copies each string it shows.
A message comes from the user's code or from a folder someone sent: an escape sequence in it
would set the terminal's title, clear the screen or hide text when printed or when a report
is shown with ``cat``, and a bidirectional override or an invisible character would make text
read differently from what it holds (a name shown reversed, two names that look alike);
:func:`printable` spells every such character out instead.

Public API: :func:`shorten`, :func:`count`, :func:`printable`, :func:`one_line`, :func:`capped`,
:data:`MAX_SHOWN_CHARS`.
"""
from __future__ import annotations

import os
import re
from typing import Any

ELLIPSIS = "…"

MAX_SHOWN_CHARS = 2_000
"""The most characters of one line of a stored string that a report page or the terminal shows;
a real message (a traceback's last line, a back-end's error) is far shorter."""

_UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff"
                     # Unicode's default-ignorable code points (DerivedCoreProperties.txt)
                     "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                     "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
                     "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
"""What a terminal or a viewer obeys instead of showing: C0 controls but the newline and the tab,
DEL, C1 controls (U+009B starts a sequence too), the line and paragraph separators (U+2028,
U+2029); what reorders or hides text: Unicode's default-ignorable code points — the bidirectional
marks, embeddings, overrides and isolates, the zero-width and invisible characters, the soft
hyphen, the Hangul fillers, variation selectors, and the tag characters (U+E0000–U+E007F, which
spell invisible text); and lone surrogates (U+D800–U+DFFF, what ``errors="surrogateescape"``
makes of a byte that is not UTF-8), which no UTF-8 file or terminal can take."""


def _spelled(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    r"""``text`` with every character of :data:`_UNSEEN` written out as Python writes it (ESC as
    ``\x1b``, U+202E as ``\u202e``), so a terminal or a viewer shows it instead of obeying it;
    the newline and the tab are kept."""
    return _UNSEEN.sub(_spelled, text)


def shown(value: object, width: int = 40) -> str:
    """``value`` as a message about a bad argument shows it: its ``repr``, cut to ``width`` characters
    (``...`` marking the cut)."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def one_line(text: str | object) -> str:
    r"""``text`` (a path, or a message meant as one line) as :func:`printable` shows it, its
    newlines spelled out too (``\n``): a folder named with a newline never splits a message in two."""
    return printable(str(text)).replace("\n", "\\n")


def shell_word(path: str | object) -> str:
    """``path`` as one word a POSIX shell reads back as that path, in printable characters: quoted when
    it holds a space, a ``$``, a quote, a ``;``… (:func:`shlex.quote`); as ``$'…'`` with its escapes
    spelled out when it holds a character :func:`printable` would spell, a newline or a tab (so the
    pasted word is the name, not its spelling); ``./`` before a name that starts with ``-`` (a command
    would read it as an option); a name starting with ``=`` quoted (zsh expands ``=name`` to a
    command's path). The folder a "continue with … --resume --out DIR" or "report DIR" line names can
    be pasted, and never runs what its name holds."""
    import shlex

    text = str(path)
    if text.startswith("-"):
        text = "./" + text
    if _UNSEEN.search(text) is None and "\n" not in text and "\t" not in text:
        quoted = shlex.quote(text)  # a leading = is safe to POSIX shells, not to zsh (=ls is /usr/bin/ls)
        return "'" + text + "'" if quoted.startswith("=") else quoted
    return "$'" + "".join(_ansi_c(char) for char in text) + "'"


def _ansi_c(char: str) -> str:
    r"""One character inside bash's ``$'…'``: a backslash and a quote escaped, the newline and the tab
    as ``\n`` and ``\t``, any other unseen character as the bytes the file system holds for it, ``\xNN``
    each (its UTF-8 bytes; a byte that was not UTF-8, a lone surrogate U+DC80–U+DCFF from
    ``surrogateescape``, as that byte). Bytes, not ``\uXXXX``: bash reads those through the locale,
    and under ``LANG=C`` it would leave ``\u202e`` as six characters."""
    if char in "\\'":
        return "\\" + char
    if char in "\n\t":
        return "\\n" if char == "\n" else "\\t"
    if _UNSEEN.match(char) is None:
        return char
    try:
        data = os.fsencode(char)
    except UnicodeEncodeError:  # a lone surrogate no byte stands for (no file name holds one)
        data = char.encode("utf-8", "surrogatepass")
    return "".join(f"\\x{byte:02x}" for byte in data)


def resume_option(folder: str | object) -> str:
    """``--resume --out DIR``, DIR as one shell word: the options that continue the run in ``folder``."""
    return f"--resume --out {shell_word(folder)}"


def same_command_resumed(folder: str | object) -> str:
    """"the same command and --resume --out DIR": what a "continue with …" hint names."""
    return f"the same command and {resume_option(folder)}"


def capped(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text`` with every line longer than ``limit`` characters cut after ``limit`` of them and
    ``"… (N more characters in the stored record)"`` in place of the rest; shorter text as it is."""
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    return "\n".join(line if len(line) <= limit else
                     f"{line[:limit]}{ELLIPSIS} ({len(line) - limit:,} more characters in the stored record)"
                     for line in lines)


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


MAX_STORED_CHARS = 20_000
"""The longest string a stored record keeps (a back-end's error message can be megabytes long):
cut after this many characters with a note of how many more there were. Pages and the terminal
show at most :data:`MAX_SHOWN_CHARS` of it anyway."""


def capped_strings(value: Any) -> Any:
    """A copy of ``value`` (JSON-like) with every string longer than :data:`MAX_STORED_CHARS` cut,
    so one runaway message never takes a file past its reader's limit (nor loses the run)."""
    if isinstance(value, str):
        if len(value) <= MAX_STORED_CHARS:
            return value
        return f"{value[:MAX_STORED_CHARS]}… ({len(value) - MAX_STORED_CHARS:,} more characters not stored)"
    if isinstance(value, dict):
        return {key: capped_strings(inner) for key, inner in value.items()}
    if type(value) in (list, tuple):
        return type(value)(capped_strings(inner) for inner in value)
    return value
