"""What a process's recorders share: the one step recorded at a time, the folders held open, and
whether the training loop that began a recorded step still runs.

A recorded step wraps ``Tensor.backward`` and runs the process's one profiler, so one step is
recorded at a time in a process (:func:`take`): a second recorder (another thread's) that would
record meanwhile leaves its step unrecorded, with a warning — unless the step that holds it is
*stale*: an integration told the recorder which loop it records in (:func:`loop_probe`: the
frame of Hugging Face's ``Trainer.train``, which gives callbacks no event when a step raises), and
that loop has ended. A stale step is ended unrecorded, and its folder released, as soon as a hook
of it runs outside that loop (the next ``backward``, forward or optimizer step of the process) or
another recorder wants to record. A recorder whose loop has ended (with or without a step open) is closed
when another recorder is made. At exit every recorder still open is ended and closed.

Public API: :func:`take`, :func:`holds`, :func:`release`, :func:`close_orphans`, :func:`opened`, :func:`closed`,
:func:`loop_probe`, :func:`records_here`.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import weakref
from typing import Callable


class _Hold:
    """One taking of the recording: a weak reference to its recorder, a new object each time (a recorder's
    ``weakref.ref`` is one cached object, so a recorder used by two threads would take it twice), and the
    thread that took it."""

    __slots__ = ("recorder", "thread")

    def __init__(self, recorder) -> None:
        self.recorder = weakref.ref(recorder)
        self.thread = threading.get_ident()


_HOLDER: dict[str, _Hold] = {}
"""The process's one recording: under :data:`_RECORDING`, the :class:`_Hold` of the recorder holding it.
Taken by one ``setdefault`` and given back by one ``pop`` (single C calls: neither another thread nor a
signal handler, which runs between bytecodes, sees it half taken), so whoever holds it is always named,
and a recorder interrupted anywhere in taking it can tell whether it holds it (:func:`holds`)."""
_RECORDING = "recording"

_OPEN: dict[int, weakref.ref] = {}
"""The recorders holding a folder's lock, by ``id``. Any thread changes it, and so may a ``__del__`` run by a
collection in the middle of a change: each change is one dict operation, and :func:`_open_recorders` lists
a copy (one C call), so neither a lock, which that ``__del__`` would wait on for ever, nor a set that changes
while it is listed."""


def records_here() -> bool:
    """Whether this process records at all: on a distributed run only rank 0 does (the rank from
    ``torch.distributed`` once initialised, else the launcher's ``RANK``)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def take(recorder) -> bool:
    """Hold the process's one recording for ``recorder``; ``False`` when a step of another thread, still
    live, holds it. A holder whose step is stale is ended first (its ``end_stale()``). Taken by this thread
    itself, which begins another step, the recording is left over: the step it was taken for was left open
    (its end cut by a signal: that step is ended, ``end_cut_step()``), or was ended and cut as it gave the
    recording back — unless that recorder is starting or ending a step right now (``busy()``: this is a signal's
    handler inside it). One collected without giving it back (its reference dead) holds nothing."""
    mine = _Hold(recorder)
    held = _HOLDER.setdefault(_RECORDING, mine)
    if held is mine:
        return True
    holder = held.recorder()
    if holder is not None and held.thread == threading.get_ident():
        if holder.busy():  # a signal's handler, inside the step that holds it as it starts or ends: still in use
            return False
        holder.end_cut_step()
    elif holder is not None:
        if not holder.stale():
            return False
        holder.end_stale()
    _give_back(held)
    return _HOLDER.setdefault(_RECORDING, mine) is mine


def holds(recorder) -> bool:
    """Whether ``recorder`` holds the process's one recording."""
    held = _HOLDER.get(_RECORDING)
    return held is not None and held.recorder() is recorder


def remember(registry: dict[int, weakref.ref], recorder) -> None:
    """``recorder`` into ``registry`` (such as :data:`_OPEN`) by ``id``, dropped once it is collected: by identity
    (a subclass may define ``__eq__``, and so be unhashable), each change one dict operation."""
    key = id(recorder)
    registry[key] = weakref.ref(recorder, lambda _, key=key: registry.pop(key, None))


def remembered(registry: dict[int, weakref.ref]) -> list:
    """The recorders of ``registry`` still alive, listed from a copy (one C call)."""
    return [recorder for recorder in (ref() for ref in registry.copy().values()) if recorder is not None]


def _open_recorders() -> list:
    return remembered(_OPEN)


def close_orphans() -> None:
    """Close every open recorder whose loop has ended (``orphaned()``: a ``train()`` that raised), its
    step, if one is open, ended unrecorded in one warning (``end_stale()``). Called as a recorder is made:
    an orphan holds its folder, which the new recorder may want (the same run retried), for no one."""
    for recorder in _open_recorders():
        if recorder.orphaned():
            if recorder.recording:
                recorder.end_stale()
            recorder.close()


def release(recorder) -> None:
    """Let another recorder of this process record, if ``recorder`` holds the recording (its step has
    ended, or never began); nothing otherwise."""
    held = _HOLDER.get(_RECORDING)
    if held is not None and held.recorder() is recorder:
        _give_back(held)


def _give_back(held: _Hold) -> None:
    """Remove ``held`` as the holder, if it still is (only its own recorder, or :func:`take` when its
    recorder is gone, gives a reference back: no other can have replaced it meanwhile)."""
    if _HOLDER.get(_RECORDING) is held:
        _HOLDER.pop(_RECORDING, None)


def opened(recorder) -> None:
    """``recorder`` holds its folder's lock (released at exit if it is never closed)."""
    remember(_OPEN, recorder)


def closed(recorder) -> None:
    ref = _OPEN.get(id(recorder))
    if ref is not None and ref() is recorder:
        _OPEN.pop(id(recorder), None)


@atexit.register
def _close_at_exit() -> None:
    """A recorder left open (a loop raised out of a recorded step): its step ends unrecorded before the
    interpreter tears the profiler down, and its folder is released."""
    for recorder in _open_recorders():
        with contextlib.suppress(Exception):
            recorder.abort()
            recorder.close()


def _forget_recorders_in_child() -> None:
    """A forked child (a DataLoader worker) inherits its parent's open recorders: they are the parent's, so the
    child's exit neither ends their steps nor says their unreached steps a second time, and a step the child
    runs is not recorded into the parent's folder (whose lock the child does not hold): one warning says so."""
    for recorder in _open_recorders():
        recorder.closed = "this StepRecorder is its parent's: this process was forked from the one that made it"
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_recorders_in_child)


def loop_probe(module_prefix: str, function: str) -> Callable[[], bool] | None:
    """Whether the call of ``function`` (defined in a module whose name begins with
    ``module_prefix``) that runs now, the outermost on this thread's stack, still runs: the probe
    answers ``True`` while that frame is on the stack of the thread that began it, asked from any
    thread (a hook run by ``DataParallel``'s threads, a training loop run in a thread of its own),
    and ``False`` once that thread has left it or ended. ``None`` when no such call runs now. The
    probe holds that frame until it is dropped."""
    frame, owner = sys._getframe(1), None
    while frame is not None:
        if frame.f_code.co_name == function and str(frame.f_globals.get("__name__", "")).startswith(module_prefix):
            owner = frame
        frame = frame.f_back
    if owner is None:
        return None
    thread = threading.get_ident()

    def alive() -> bool:
        here = sys._getframe(1) if threading.get_ident() == thread else sys._current_frames().get(thread)
        while here is not None:
            if here is owner:
                return True
            here = here.f_back
        return False

    alive.frame = owner  # which call it watches: a loop begun again inside the same call is told from another
    return alive
