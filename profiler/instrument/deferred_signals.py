"""Signals held back while a run's state changes, delivered the moment the change is whole.

Python runs a signal's handler in the main thread between two bytecodes, so Ctrl-C
(``KeyboardInterrupt``), a command's SIGTERM handler or a user's own alarm handler can raise in the
middle of taking a folder's lock or of making a recorder: the lock taken but not yet recorded as the
recorder's, or its note written but not yet removable, and nothing left that would release it before
the process ends. Within :func:`deferred`, the main thread's Python-level handlers are replaced by one
that only notes which signal came; on leaving, the handlers are put back and each noted signal is
raised again (:func:`signal.raise_signal`), so that its own handler runs right after the change, where
an exception it raises finds the state whole.

Other threads need nothing: a handler never runs in them. A signal without a Python handler (the
default action of SIGTERM or SIGKILL, which end the process) is not held back: the operating system
releases what the process held. Nested uses hold back until the outermost ends.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

_depth = 0  # nested deferrals of the main thread (only the main thread changes it)


@contextlib.contextmanager
def deferred(undo: Callable[[], object] | None = None) -> Iterator[None]:
    """Hold back the main thread's Python signal handlers for the ``with`` block (module docstring).

    ``undo``: takes back what the block did when a handler delivered at its end raises (the signal
    came before the change was whole, so the change does not stand: a lock just taken is released);
    only the outermost deferral delivers, so a nested block's change is the outer one's to take back.
    """
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth:  # within an outer deferral: its handlers already note what comes
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    came: list[int] = []
    held, wakeup = _hold(came)
    _depth = 1
    try:
        yield
    except BaseException:  # the block's own failure, undone by the block: the signals still come
        _restore(held, wakeup)
        _deliver(came)
        raise
    _restore(held, wakeup)
    try:
        _deliver(came)
    except BaseException:
        if undo is not None:
            with deferred():  # a signal during the undo comes after it
                undo()
        raise


def _restore(held: dict[int, object], wakeup: int) -> None:
    global _depth
    _depth = 0
    for number, handler in held.items():
        signal.signal(number, handler)
    if wakeup != -1:
        signal.set_wakeup_fd(wakeup)


def _deliver(numbers: list[int]) -> None:
    """Raise each signal again, in order, so its handler runs now; every one is delivered even when a
    handler raises (the first exception is raised once all have run)."""
    first: BaseException | None = None
    for number in dict.fromkeys(numbers):  # each signal once, in the order it came
        try:
            signal.raise_signal(number)
        except BaseException as exc:  # noqa: BLE001 - a handler's own exception, raised below
            first = first or exc
    if first is not None:
        raise first


def _hold(came: list[int]) -> tuple[dict[int, object], int]:
    """Replace every Python-level handler with one that appends its signal to ``came``, and set aside the
    wake-up descriptor (an event loop's, :func:`signal.set_wakeup_fd`, which would see the signal now
    and again when it is delivered); the handlers replaced, by signal number, and that descriptor (-1:
    none). Plain numbers, not :func:`signal.valid_signals`'s enum members: a signal that lands before
    its handler is replaced runs that handler here, so this loop is kept short."""
    held: dict[int, object] = {}
    wakeup = signal.set_wakeup_fd(-1)

    def note(number: int, frame: object) -> None:
        came.append(number)

    try:
        for number in range(1, signal.NSIG):
            try:
                handler = signal.getsignal(number)
                if callable(handler):
                    held[number] = handler
                    signal.signal(number, note)
            except (ValueError, OSError, RuntimeError):  # not a signal here, or one Python cannot handle
                held.pop(number, None)
    except BaseException:  # a signal landed before its handler was replaced: every handler put back
        _restore(held, wakeup)
        raise
    return held, wakeup
