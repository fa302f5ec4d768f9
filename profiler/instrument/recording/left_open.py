"""Recorded steps that nothing will end: what began them is over, and they are ended unrecorded.

Two ways a step is left open, each found at the first moment the recorder can tell:

- *stale*: an integration told the recorder which loop it records in (``loop_alive``: Hugging Face's
  ``Trainer.train``, which gives callbacks no event when a step raises), and that loop has ended. The
  process's one recording (:mod:`.holder`) and the folder are then given up, the step ended unrecorded.
- *cut*: a signal's exception (Ctrl-C) landed as a ``with recorder.step():`` block was left (or as
  ``finish()`` was called), before the step's end ran any of its code (at the entry of ``__exit__``: no
  ``try`` can be there yet), and the loop went on. Steps of one thread do not nest, so a step of this thread
  still open when its next ``step()`` or ``start()`` is asked for (of this recorder or another) is such a step:
  ended unrecorded there, before its profiler and hooks measure the steps after it. (A ``close()`` before any
  next step ends it as recorded, as it ends a step a signal's handler closes the recorder in: the two cannot be
  told apart.) A step asked for inside another of the same thread ends that one likewise.

Public API: :class:`LeftOpenSteps` (a part of :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`).
"""
from __future__ import annotations

import threading

from fusedce_profiler.instrument.recording.notice import notice
from fusedce_profiler.instrument.text import one_line


class LeftOpenSteps:
    """A recorder's left-open steps. The recorder provides ``_active`` (the step being recorded, a
    :class:`~fusedce_profiler.instrument.recording.phases.StepRecording`), ``loop_alive``, ``out``, ``records``,
    :meth:`_abort`, :meth:`_close` (their bodies, under the lock), :meth:`after_close`, :meth:`_end` and
    :meth:`_change_at_most`."""

    def orphaned(self) -> bool:
        """Whether the loop this recorder records (``loop_alive``, when an integration knows it) has ended."""
        alive = self.loop_alive
        return alive is not None and not alive()

    def stale(self) -> bool:
        """Whether a step is being recorded and the loop that began it has ended (:mod:`.holder`): a step
        takes its recorder's ``loop_alive``, which changes only once the recorder is closed."""
        return self._active is not None and self.orphaned()

    def end_stale(self) -> None:
        """End a stale step unrecorded and release the folder: its loop will never end it (the caller knows it
        is stale). Several threads' hooks may find it stale at once (data-parallel replicas): under the recorder's
        lock, waited on at most as long as ``close()`` waits, the first ends it, closes the recorder and says so;
        the others find no step and do nothing."""
        ended = []

        def end() -> None:
            step = self._active
            if step is not None:
                self._abort()  # first: a warning taken as an error (-W error) must not leave the step open
                if self._active is None:  # not when run inside that step's end (a handler's): that end decides
                    ended.append(step.index)
                self._close()
        self._change_at_most("ending a stale step", end)
        if ended:
            notice(f"fusedce-profile: step {ended[0]} is not recorded: the training loop that began it ended (an "
                   f"exception left it); {one_line(self.out)} is released", stacklevel=3)
            self.after_close()  # what a run's end says (the public recorder: the steps never reached)

    def _ended_if_stale(self) -> bool:
        return self.stale() and (self.end_stale() or True)  # a stale step ended: True

    def end_cut_step(self) -> None:
        """Before this thread's next step (of this recorder or another: :func:`.holder.take`): end unrecorded a
        step of its own still open, whose end a signal cut (or that the next one is nested in); another thread's
        step, recording meanwhile, is that thread's to end. Ended first, said after: a warning taken as an error
        (``-W error``) must not leave it open; ended by :meth:`_end`, so a ``close()`` meanwhile (a signal's
        handler) ends nothing more."""
        cut = self._active
        if cut is None or cut.thread != threading.get_ident():
            return
        try:
            self._end(cut, ok=False)
        finally:  # said once it is ended, also when a signal cuts the ending (not if a close() meanwhile wrote it)
            last = self.records[-1] if self.records else None  # no call: a signal cannot land before the warning
            if self._active is not cut and (last is None or last.step != cut.index):
                notice(f"fusedce-profile: step {cut.index} is not recorded: it was still open as this thread's next "
                       "step began (its end cut by a signal, or one step inside another: two recorders in one loop)",
                       stacklevel=4)
