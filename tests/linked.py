"""A run folder whose file is a symbolic link to a file outside it, for the confinement tests."""
from __future__ import annotations

import os
from pathlib import Path

UNTOUCHED = b"line one\nunterminated"
"""What the file outside holds: its last line has no newline, so a partial-line repair that
followed the link would cut it."""


def link_out(folder: Path, name: str, *, hard: bool = False) -> Path:
    """Create ``folder`` with ``name`` linked (symbolically, or with ``hard`` a second name of the
    same file) to a file beside the folder holding :data:`UNTOUCHED`; returns that outside file
    (the test checks it still holds :data:`UNTOUCHED`)."""
    outside = folder.parent / f"outside-{Path(name).name}"
    outside.write_bytes(UNTOUCHED)
    folder.mkdir(parents=True, exist_ok=True)
    if hard:
        os.link(outside, folder / name)
    else:
        (folder / name).symlink_to(outside)
    return outside
