"""The process table as Linux's ``/proc`` shows it, and signals that take a process gone in their stride.

Every function reads ``/proc`` afresh and answers for that instant: a process read here may be gone
by the time its answer is used (a pid comes round to another process only after tens of thousands
of forks).
"""
from __future__ import annotations

import os
import signal


def stat_fields(pid: int, open=open) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the state first: field 3 of
    ``proc(5)`` is index 0 here); ``None`` when ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_of(pid: int, fields=stat_fields) -> int:
    """``pid``'s parent's pid, from /proc (0 when ``pid`` is gone)."""
    found = fields(pid)
    return int(found[1]) if found and len(found) > 1 else 0


def children_of(pid: int) -> list[int]:
    """``pid``'s children (every thread's), from /proc, zombies included."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found.extend(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            pass
    return found


def lives(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and has not exited (a zombie waiting for its parent does not)."""
    return process_state(pid) not in ("", "Z", "X")


def process_state(pid: int) -> str:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``…), ``""`` when it is gone."""
    found = stat_fields(pid)
    return found[0].decode() if found else ""


_STOP_SIGNALS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def stopped(pid: int, open=open) -> bool:
    """Whether ``pid`` is stopped (``SIGSTOP``, or stopped under a tracer) or will be: a stop signal
    sent to it and not yet acted on (a process acts on it when it next runs, which on a loaded machine
    can be seconds after the sender's ``kill`` returned) — ``SIGSTOP``, which nothing can catch or
    block, or another stop signal it neither catches, ignores nor blocks."""
    fields = stat_fields(pid, open)
    if fields and fields[0] in (b"T", b"t"):
        return True
    masks = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"):
                    masks[name] = int(value, 16)
    except (OSError, ValueError):
        return False
    pending = masks.get("SigPnd", 0) | masks.get("ShdPnd", 0)
    handled = masks.get("SigBlk", 0) | masks.get("SigIgn", 0) | masks.get("SigCgt", 0)
    return any(pending >> (sig - 1) & 1 and (sig == signal.SIGSTOP or not handled >> (sig - 1) & 1)
               for sig in _STOP_SIGNALS)


def descendants(root: int, skip: set[int] = frozenset()) -> list[int]:
    """Every process under ``root`` (its children, theirs, ...), those in ``skip`` and their subtrees left out."""
    tree, frontier, found = [], [root], set(skip) | {root}
    while frontier:
        children = [c for pid in frontier for c in children_of(pid) if c not in found]
        found.update(children)
        tree.extend(children)
        frontier = children
    return tree


def started(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``None`` when it is gone)."""
    found = stat_fields(pid)
    return int(found[19]) if found and len(found) > 19 else None


def group_of(pid: int) -> int:
    """``pid``'s process group (0 when ``pid`` is gone)."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return 0


def group_lives(group: int) -> bool:
    """Whether process group ``group`` has a member this user may signal."""
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_quietly(send, target: int, sig: int = signal.SIGKILL) -> None:
    """``send(target, sig)`` (``os.kill`` or ``os.killpg``); a target gone, or not this user's, is no error."""
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_with_group(pid: int) -> None:
    """SIGKILL ``pid``, with its whole process group where it leads one (what a helper started in its own group)."""
    try:
        leads = os.getpgid(pid) == pid
    except ProcessLookupError:
        return
    signal_quietly(os.killpg if leads else os.kill, pid)
