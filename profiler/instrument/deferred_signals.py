"""Signals held back while a run's state changes, delivered the moment the change is whole.

Python runs a signal's handler in the main thread between two bytecodes, so Ctrl-C
(``KeyboardInterrupt``), a command's SIGTERM handler or a user's own alarm handler can raise in the
middle of taking a folder's lock or of making a recorder: the lock taken but not yet recorded as the
recorder's, or its note written but not yet removable, and nothing left that would release it before
the process ends. Within :func:`deferred`, the main thread's Python-level handlers are replaced by one
that only notes which signal came; on leaving, the handlers are put back and the handler of each noted
signal is run, so that it runs right after the change, where an exception it raises finds the state
whole.

Other threads need nothing: a handler never runs in them. A signal without a Python handler (the
default action of SIGTERM or SIGKILL, which end the process) is not held back: the operating system
releases what the process held. Nested uses hold back until the outermost ends. Each signal that came
is delivered as often as it came, in order. A handler that the block, or a handler, installed meanwhile
is left in place. A process forked meanwhile (from another thread) gets the handlers back at once: the
signals held back are its parent's.

Putting a handler back with :func:`signal.signal` would install Python's own C-level handler with its
own flags, dropping what the program had set below Python: a C handler installed over Python's
(``faulthandler.register(..., chain=True)``, a native runtime's) and ``SA_RESTART``
(:func:`signal.siginterrupt`). So each signal's whole operating-system disposition (its ``struct
sigaction``, copied as opaque bytes through the C library) is read before its handler is replaced and
written back after, where the C library can be asked (not on Windows, which has no ``sigaction``).
The replaced handler stays observable meanwhile (:func:`signal.getsignal`): code that runs within
the block and chains to it reaches the program's handler once the block has ended.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

SIGACTION_BYTES = 1024  # more than any C library's struct sigaction (glibc's is 152 bytes, macOS's 16)


class _Held:
    """The main thread's deferral: the Python handlers it replaced (by signal number), the signals that
    came meanwhile, and how many ``with`` blocks are open in it."""

    def __init__(self) -> None:
        self.handlers: dict[int, object] = {}
        self.dispositions: dict[int, ctypes.Array] = {}  # each replaced signal's struct sigaction, as it was
        self.came: list[int] = []
        self.depth = 1
        self.finished = False  # handlers back and every signal delivered, none raising

    def note(self, number: int, frame: object) -> None:
        """A signal came: noted while this deferral is open; once it has ended (a handler installed
        within it chains to this one), passed to the program's handler it replaced, at once."""
        if _active is self:
            self.came.append(number)
            return
        handler = self.handlers.get(number)  # only Python-level handlers are replaced: a callable
        if handler is not None:
            handler(number, frame)

    def hold(self) -> None:
        """Replace every Python-level handler with :meth:`note`. Plain numbers, not
        :func:`signal.valid_signals`'s enum members: a signal that lands before its handler is replaced
        runs that handler here, so this loop is kept short."""
        for number in range(1, signal.NSIG):
            try:
                handler = signal.getsignal(number)
            except ValueError:  # not a signal on this system (only that: a handler's own exception goes on)
                continue
            if callable(handler):
                self.handlers[number] = handler  # put back only if still replaced (put_back)
                self.dispositions[number] = _disposition(number)
                signal.signal(number, self.note)

    def put_back(self) -> None:
        """Every handler replaced back (one changed meanwhile stays as changed). A signal landing
        meanwhile, its handler just put back raising, stops nothing: the rest are put back, then its
        exception is raised."""
        first: BaseException | None = None
        pending, cut = list(self.handlers.items()), 0
        while pending and cut <= len(self.handlers):  # each cut by a signal's exception resumes where it was
            try:
                while pending:
                    number, handler = pending[0]
                    current = signal.getsignal(number)
                    if current == self.note:
                        signal.signal(number, handler)
                        current = handler
                    if current is handler:  # put back now, or before a signal cut this loop: its disposition too
                        _set_disposition(number, self.dispositions.get(number))
                    pending.pop(0)
            except BaseException as exc:  # noqa: BLE001 - raised once all are back
                first, cut = first or exc, cut + 1
        if first is not None:
            raise first


_active: _Held | None = None  # the main thread's open deferral


def _sigaction() -> Callable | None:
    """The C library's ``sigaction``, or None where there is none to ask."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError, TypeError):  # Windows: no C library by that name, no sigaction
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    return function


_SIGACTION = _sigaction()


def _disposition(number: int) -> ctypes.Array | None:
    """Signal ``number``'s operating-system disposition (its ``struct sigaction``, opaque), or None."""
    if _SIGACTION is None:
        return None
    saved = ctypes.create_string_buffer(SIGACTION_BYTES)
    return saved if _SIGACTION(number, None, saved) == 0 else None


def _set_disposition(number: int, saved: ctypes.Array | None) -> None:
    """Signal ``number``'s disposition set back to ``saved`` (:func:`_disposition`'s), if there is one."""
    if saved is not None:
        _SIGACTION(number, saved, None)


@contextlib.contextmanager
def deferred(undo: Callable[[], object] | None = None) -> Iterator[None]:
    """Hold back the main thread's Python signal handlers for the ``with`` block (module docstring).

    ``undo``: takes back what the block did when a handler delivered at its end raises (the signal
    came before the change was whole, so the change does not stand: a lock just taken is released);
    only the outermost deferral delivers, so a nested block's change is the outer one's to take back.
    """
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _active is not None:  # within an outer deferral: its handlers already note what comes
        _active.depth += 1
        try:
            yield
        finally:
            _active.depth -= 1
        return
    held = _active = _Held()
    try:
        held.hold()
    except BaseException:  # a handler not yet replaced raised: everything back, what came delivered
        with contextlib.suppress(BaseException):
            _finish(held, undo=None)
        raise
    try:
        yield
    except BaseException:  # the block's own failure, undone by the block: the signals still come
        _finish(held, undo=None)
        raise
    try:
        _finish(held, undo)
    except BaseException:
        if held.finished and undo is not None:  # a signal as _finish returned: the change does not stand
            with deferred():
                undo()
        raise


def _finish(held: _Held, undo: Callable[[], object] | None) -> None:
    """End ``held``: the handlers back, then each signal that came delivered; when either raises,
    ``undo`` (itself deferred), then the first exception. Straight calls, each in its own ``try``: a
    handler runs only at a call or a loop's jump back, so nothing can cut between them."""
    global _active
    errors: list[BaseException] = []
    try:
        held.put_back()
    except BaseException as exc:  # noqa: BLE001 - raised below, once all has run
        errors.append(exc)
    _active = None  # only now: a child forked before has its handlers put back by its own hook
    try:
        _deliver(held.came)
    except BaseException as exc:  # noqa: BLE001 - raised below
        errors.append(exc)
    if errors:
        if undo is not None:
            with deferred():  # a signal during the undo comes after it
                undo()
        raise errors[0]
    held.finished = True


def _deliver(numbers: list[int]) -> None:
    """Run the handler of each signal now, as often as it came and in order: the handler installed now,
    called as Python calls it (a default action is taken by raising the signal again; an ignored one is
    dropped). Called, not raised again: the signal has been through the process's wake-up descriptor
    (:func:`signal.set_wakeup_fd`: an event loop's) once, as it came. Every one runs even when a handler
    raises (the first exception is raised once all have run)."""
    first: BaseException | None = None
    pending, cut = list(numbers), 0
    while pending and cut <= len(numbers):  # a handler's exception, or a signal's as it loops, resumes it
        try:
            while pending:
                number = pending.pop(0)
                handler = signal.getsignal(number)
                if callable(handler):
                    handler(number, sys._getframe())
                elif handler == signal.SIG_DFL:
                    signal.raise_signal(number)
        except BaseException as exc:  # noqa: BLE001 - a handler's own exception, raised below
            first, cut = first or exc, cut + 1
    if first is not None:
        raise first


def _put_back_in_child() -> None:
    """A process forked while the main thread held signals back (a fork from another thread): its
    handlers back at once; the signals held back are its parent's."""
    global _active
    held, _active = _active, None
    if held is not None:
        held.came.clear()
        with contextlib.suppress(BaseException):
            held.put_back()


os.register_at_fork(after_in_child=_put_back_in_child)
