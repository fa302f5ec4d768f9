"""Read the README and the docs/ pages as a reader does: their fenced blocks, the
``fusedce-profile`` commands in them, their links; and parse a command line with the real CLI
without running it.

A command's optional parts may be written in brackets (``[--device cuda]``) and elisions as
``…``; both are dropped before parsing. A command may continue on the next line with ``\\``.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from processes import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def fenced_blocks(text: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of a Markdown text (``language``: only those marked with it)."""
    return [m.group(2) for m in _FENCE.finditer(text) if language is None or m.group(1) == language]


def logical_lines(block: str) -> list[str]:
    """A shell block's lines with ``\\`` continuations joined and comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def commands(text: str, program: str = "fusedce-profile") -> list[list[str]]:
    """Every fenced command line that starts with ``program`` (after a ``$ `` prompt, or after
    ``&&``), as argv without the program; brackets of optional parts and elisions removed,
    comments dropped; other lines of a block (shown output) are passed over."""
    found = []
    for block in fenced_blocks(text):
        for line in logical_lines(block):
            for part in line.split("&&"):
                part = part.strip().removeprefix("$ ")  # a shell prompt before a command
                if not part.startswith(program):  # output shown beside the commands, not one of them
                    continue
                words = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", part), comments=True)
                words = [w for w in words if w not in ("…", "...")]
                if words and words[0] == program:
                    found.append(words[1:])
    return found


def parse_command(argv: list[str]) -> None:
    """Parse ``fusedce-profile ARGV`` with the real command line (types, choices, callbacks such
    as ``--mode``'s) without running it; raises click's ``UsageError`` on a bad line."""
    from typer.main import get_command

    from fusedce_cli.app import app

    group = get_command(app)
    if argv and not argv[0].startswith("-"):
        command = group.get_command(None, argv[0])  # type: ignore[arg-type]
        if command is None:
            raise ValueError(f"fusedce-profile has no command {argv[0]!r}")
        with group.make_context("fusedce-profile", []) as parent, command.make_context(argv[0], list(argv[1:]),
                                                                                       parent=parent):
            pass
    else:
        with group.make_context("fusedce-profile", list(argv)):
            pass


def relative_links(page: Path) -> list[tuple[str, Path]]:
    """(link as written, the file or folder it points at) of every relative link of ``page``."""
    out = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (page.parent / target.split("#", 1)[0]).resolve()))
    return out


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown text."""
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
