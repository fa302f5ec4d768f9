"""A run folder whose file is a symbolic link to a file outside it, for the confinement tests."""
from __future__ import annotations

from pathlib import Path

UNTOUCHED = b"line one\nunterminated"
"""What the file outside holds: its last line has no newline, so a partial-line repair that
followed the link would cut it."""


def link_out(folder: Path, name: str) -> Path:
    """Create ``folder`` with ``name`` linked to a file beside the folder holding :data:`UNTOUCHED`;
    returns that outside file (the test checks it still holds :data:`UNTOUCHED`)."""
    outside = folder.parent / f"outside-{Path(name).name}"
    outside.write_bytes(UNTOUCHED)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).symlink_to(outside)
    return outside
