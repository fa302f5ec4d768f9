"""Whether a process's environment block holds an entry, read in bounded pieces.

The tool finds the processes a worker started by the mark in their environment (``NAME=value``,
inherited by every descendant), reading ``/proc/PID/environ``. That file is the range of memory the
process itself names as its environment, and a process may name any range (``prctl(PR_SET_MM)``):
a job's helper can point it at gigabytes of the zero page, which cost the helper nothing. Read
whole and split, each such reading cost the reading command about nine times the block's size.

So the block is read in pieces of :data:`PIECE_BYTES` and only its first :data:`MOST_BYTES` are
searched. A block set up by ``exec`` is at most a quarter of the stack limit (2 MiB with the usual
8 MiB) together with the arguments, and the worker's mark is inherited at its place in that block;
a longer block was set by the process itself, after which it can just as well leave the mark out
(the documented limit of finding processes by their environment).
"""
from __future__ import annotations

from typing import BinaryIO

PIECE_BYTES = 1 << 16
MOST_BYTES = 4 << 20
"""How much of a block is searched: twice the most ``exec`` sets up with an 8 MiB stack limit."""


def holds_entry(pid: int, entry: bytes) -> bool:
    """Whether the environment of ``pid`` holds ``entry`` (``b"NAME=value"``) as a whole entry
    among its first :data:`MOST_BYTES`. ``OSError`` when it cannot be read (gone, another user's)."""
    with open(f"/proc/{pid}/environ", "rb", buffering=0) as block:
        return block_holds(block, entry)


def block_holds(block: BinaryIO, entry: bytes) -> bool:
    """Whether the NUL-separated entries read from ``block`` hold ``entry`` among their first
    :data:`MOST_BYTES`; memory: two pieces of :data:`PIECE_BYTES` at a time, whatever the block's size."""
    needle = b"\0" + entry + b"\0"
    carried = b"\0"  # the block's first entry has no NUL before it
    searched = 0
    while searched < MOST_BYTES:
        piece = block.read(min(PIECE_BYTES, MOST_BYTES - searched))
        if not piece:
            return (carried + b"\0").endswith(needle)  # the last entry may lack its NUL
        window = carried + piece
        if needle in window:
            return True
        carried = window[-(len(needle) - 1):]
        searched += len(piece)
    return False
