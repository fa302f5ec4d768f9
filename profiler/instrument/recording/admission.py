"""Which requested steps a recorder records: one at a time, decided under one lock across threads.

A recorder's steps change state in a few places: a step asked for and begun (``step()`` and the
``with`` block's entry, ``start()``), ended (the block's exit, ``finish()``, ``abort()``, a stale
or cut step ended), the recorder closed. Each runs whole under the recorder's re-entrant lock
(:attr:`Admission._serial`), so a change another thread makes meanwhile waits and then sees its
outcome: a step asked for while another thread's step is being started, recorded or written is not
recorded, with one warning naming that step — never recorded twice, dropped without a word, or left
open because its end came while another's was being written. Re-entrant because a signal's handler
runs in the main thread between two bytecodes, inside whatever that thread was doing: a handler's
step inside this thread's own start or end is told apart by :meth:`Admission.busy` (:mod:`.holder`).

The lock is held while a step is started and while it is ended and written (the report rendered
after it included); a step of a recorder used by one thread never waits on it. It is taken by a
``with`` statement (nothing can land between its taking and the block that gives it back), except
by ``close()`` and ``abort()``, which also run at exit and in signal handlers: they wait at most
:data:`CLOSE_WAIT_S` (a daemon thread stopped inside a change must not hang the interpreter's
exit), in slices taken with the main thread's signals held back until each is noted. A forked
child gives every recorder a lock of its own. Not contained: a signal's handler that asks for a
step while another thread holds the lock and waits for what the interrupted main thread holds.

Public API: :data:`NOOP`, :class:`Admission` (a part of
:class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable

from fusedce_profiler.instrument import deferred_signals
from fusedce_profiler.instrument.recording import holder
from fusedce_profiler.instrument.recording.notice import notice

CLOSE_WAIT_S = 30.0  # longer than a step's start and its end with the report rendered
WAIT_SLICE_S = 0.05  # close() and abort() wait in slices, each with signals held back (below)
NOOP = contextlib.nullcontext()  #: What ``step()`` returns on a step not recorded (reusable, stateless)


class Admission:
    """A recorder's decision which step to record. The recorder provides ``enabled``, ``steps``, ``closed``,
    ``count``, ``_done`` (the requested steps decided: recorded or said not to be) and ``_active`` (the step being
    recorded); this part holds ``_serial``, ``_starting`` (starts under way in this recorder: a signal's handler
    may begin one inside another), ``_ending`` (a step is being ended and written) and ``_parents`` (this is a
    forked child's copy: a step open at the fork is the parent's to write)."""

    def _admission_init(self) -> None:
        self._serial = threading.RLock()
        self._without = threading.local()  # .on: this thread's close() or abort() goes on without the lock
        self._starting = 0
        self._ending = False
        self._parents = False
        holder.remember(_RECORDERS, self)

    def forked(self) -> None:
        """This is a forked child's copy of the recorder: its lock is made anew (held by a thread of the parent
        as the fork came, it would be held for ever here, where that thread does not exist), and a step open at
        the fork is its parent's (ended unrecorded here, written there)."""
        self._serial = threading.RLock()
        self._without = threading.local()
        self._parents = True

    def _serial_unless_going_on(self):
        """The lock, or nothing in a ``close()`` or ``abort()`` of this thread that already waited for it in
        vain (the step is ended without it, not after a second wait)."""
        return contextlib.nullcontext() if getattr(self._without, "on", False) else self._serial

    def _change_at_most(self, doing: str, change: Callable[[], None]) -> None:
        """``change()`` under the lock, waited on at most :data:`CLOSE_WAIT_S` (``close()``, ``abort()``: also run
        at exit and by signal handlers); then ``doing`` goes on without it, said once. A signal's exception may
        land at any call's return here: the lock is noted as taken where no handler can run (:meth:`_wait_at_most`)
        and given back in this frame's ``finally`` before any call, so none leaves it held."""
        hold = _Hold()
        try:
            self._wait_at_most(hold, doing)
            change()
        finally:  # no call before the release: a handler runs only at a call's start or return, or a jump back
            if hold.going_on:
                self._without.on = False
            if hold.got:
                hold.got = False
                self._serial.release()

    def _wait_at_most(self, hold: "_Hold", doing: str) -> None:
        """Take the lock into ``hold`` in slices of :data:`WAIT_SLICE_S`, each with the main thread's signals held
        back until whether it was taken is noted in ``hold``; after :data:`CLOSE_WAIT_S` in vain, ``hold.going_on``.
        Nothing when an outer ``close()`` of this thread already went on without it."""
        if getattr(self._without, "on", False):
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        while True:
            with deferred_signals.deferred():
                hold.got = self._serial.acquire(timeout=WAIT_SLICE_S)
            if hold.got:
                return
            if time.monotonic() >= deadline:
                notice(f"fusedce-profile: {doing} while another thread has been starting or ending a step of "
                       f"this StepRecorder for {CLOSE_WAIT_S:.0f} s: without waiting for it", stacklevel=4)
                hold.going_on = True  # first: the finally ends what it marks, and nothing can land between the two
                self._without.on = True
                return

    def unreached(self) -> list[int]:
        """The requested steps the run never reached, in order (not those reached but left unrecorded)."""
        return sorted(s for s in self.steps if s not in self._done and s >= self.count)

    def seen(self, index: int) -> None:
        """Note that step ``index`` ran (integrations call it for every step, recorded or not)."""
        self.count = max(self.count, int(index) + 1)

    def wants(self, index: int) -> bool:
        """Whether step ``index`` would be recorded (for integrations starting and ending it apart).
        A requested step that a closed recorder will not record is said once, in a warning."""
        requested = self.enabled and index in self.steps and index not in self._done
        if requested and self.closed:
            self._done.add(index)
            notice(f"fusedce-profile: step {index} is not recorded: {self.closed} (a new StepRecorder records "
                   "again)", stacklevel=3)
        return requested and not self.closed and self._active is None

    def _refused(self, index: int, stacklevel: int = 4) -> contextlib.nullcontext:
        """Step ``index`` begins and :meth:`wants` said no, or another step began since it said yes: if it was
        requested and is still undecided, not recorded, said once (another thread's step was being recorded; or
        this thread's was being started or ended, a signal's handler now running inside it). Returns a null
        context, :data:`NOOP`."""
        active = self._active
        if active is not None and active.index == index:  # asked again while it is being recorded: it is
            return NOOP
        if self.enabled and index in self.steps and index not in self._done and not self.closed:
            self._done.add(index)
            notice(f"fusedce-profile: step {index} is not recorded: this StepRecorder was recording "
                   f"{f'step {active.index}' if active is not None else 'another step'} (one step at a time)",
                   stacklevel=stacklevel)
        return NOOP

    def busy(self) -> bool:
        """Whether a step is being started or ended now (a signal's handler then runs inside it: holder.take)."""
        return self._starting > 0 or self._ending


class _Hold:
    """What one ``close()`` or ``abort()`` holds of the recorder's lock: ``got`` (taken), ``going_on`` (waited for
    in vain: this thread's ``_without.on`` set)."""

    __slots__ = ("got", "going_on")

    def __init__(self) -> None:
        self.got = self.going_on = False


_RECORDERS: dict[int, weakref.ref] = {}
"""Every recorder of this process, open or not (:func:`.holder.remember`): a forked child gives each a lock of its
own."""


def _new_locks_in_child() -> None:
    for recorder in holder.remembered(_RECORDERS):
        recorder.forked()


os.register_at_fork(after_in_child=_new_locks_in_child)
