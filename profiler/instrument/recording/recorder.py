"""Record a training step from inside the user's own loop: phases, allocator snapshot, attribution.

``StepRecorder(model, out, steps=(2, 50))`` counts steps; ``with recorder.step(): ...`` around one step (forward,
loss, backward, optimizer) records it when its index is one of ``steps`` and is a plain counter check otherwise: no
hook, no profiler, nothing allocated (:data:`NOOP` is returned). A recorded step:

1. synchronises, locates the LM head, final norm and embedding (:mod:`~fusedce_profiler.instrument.recording.landmarks`,
   once per recorder) and reads what is alive and reserved before it starts, with signals held back
   (:mod:`~fusedce_profiler.instrument.recording.beginning`; so is its end, until it is written);
2. marks phases through hooks — ``forward`` at the start; ``loss`` at the end of the final norm's forward, the LM
   head's forward pre-hook or the end of the model's forward (whichever comes first); ``backward`` when
   ``Tensor.backward``/``torch.autograd.backward`` is called (the two are wrapped for the recorded step only:
   autograd has no hook for "a backward begins"); ``optimizer`` from a global optimizer step pre-hook. Phases only
   move forward (a final norm re-run by activation checkpointing in backward marks nothing); :meth:`~StepRecorder.mark`
   sets one explicitly (hooks and meters: :mod:`~fusedce_profiler.instrument.recording.phases`);
3. meters every phase: on CUDA the caching allocator's counters (peak allocated and reserved per phase, device use
   at each mark), on the CPU the profiler's memory events (:mod:`fusedce_profiler.instrument.protocol`); optionally
   (``trace``) wraps the step in :class:`fusedce_profiler.instrument.tracing.trace.StepTracer` for the peak by
   module and kind and the logits detector; optionally (``snapshot``, CUDA) records the allocator's history and
   stores the raw snapshot and its timeline (:mod:`fusedce_profiler.instrument.snapshot`);
4. appends a :class:`~fusedce_profiler.instrument.recording.records.RecordedStep` (built by
   :mod:`~fusedce_profiler.instrument.recording.assemble`) to the folder's ``recorded_steps.jsonl`` and writes
   ``environment.json`` once.

A failure of the recorder itself never stops the user's training: it is reported as a warning (:mod:`.notice`, never
raised) and the step runs unrecorded; so is a folder that cannot be written, that another run holds, or that fills up
(the recorder then records nothing more). One step is recorded at a time in a process: a step another recorder
(another thread's) would record meanwhile runs unrecorded, with a warning. On a distributed run only rank 0 records.
Public API: :class:`StepRecorder`, :data:`NOOP` (the public face, rendering the report too: :mod:`fusedce_profile`).
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from fusedce_profiler.instrument import confined, deferred_signals, store
from fusedce_profiler.instrument.callables import what_it_raised
from fusedce_profiler.instrument.confined import FolderRefused
from fusedce_profiler.instrument.recording import holder
from fusedce_profiler.instrument.recording.admission import NOOP, Admission
from fusedce_profiler.instrument.recording.arguments import checked_flags, checked_out, checked_steps, checked_subject
from fusedce_profiler.instrument.recording.assemble import RecordedSubject, build_record
from fusedce_profiler.instrument.recording.beginning import StepBeginning
from fusedce_profiler.instrument.recording.eval_passes import EvalPasses
from fusedce_profiler.instrument.recording.folder import (RecordingExists, absolute_folder, save_environment_once,
                                                         take_folder)
from fusedce_profiler.instrument.recording.landmarks import batch_shape
from fusedce_profiler.instrument.recording.left_open import LeftOpenSteps
from fusedce_profiler.instrument.recording.notice import notice
from fusedce_profiler.instrument.recording.phases import SharedProfilerMeter, StepRecording
from fusedce_profiler.instrument.text import one_line
from fusedce_profiler.instrument.recording.records import EvalPass, RecordedStep, append_recorded_step


class StepRecorder(Admission, StepBeginning, EvalPasses, LeftOpenSteps):
    """Record the named steps of a training loop into the run folder ``out``.

    ``model``: the module being trained (a LightningModule or a wrapper is fine: the LM head is located inside it);
    ``steps``: 0-based indices of the steps to record (the recorder counts :meth:`step` calls, or takes the index
    given to it). ``label``: a name for this run in the report (``"naive"``, ``"fused"``); ``fused``: whether the
    loss is meant to be fused (``True``/``False``/``None``: not said). ``head``: the LM head's attribute path when
    it cannot be found (default: ``get_output_embeddings()``, else the last ``nn.Linear`` with ``out_features`` =
    ``vocab``); ``vocab``, ``batch``, ``seq``: when not found from the head and the input ids. ``trace``: attribute
    the peak by module and kind (``torch.profiler``; slows the recorded step); ``snapshot``: store the CUDA
    allocator snapshot. ``force``: replace a recording already in ``out`` (else ``FileExistsError``); ``append``:
    add to it instead (another run of the same model, e.g. with the fused loss: the report compares runs by
    ``label``). :meth:`after_record` is called after each record is written (the public API renders the report
    there). A relative ``out`` is taken from the current folder once, here. Once closed it records nothing more.
    """

    def __init__(self, model: nn.Module, out: str | Path, *, steps: Iterable[int] = (2,), label: str = "",
                 fused: bool | None = None, head: str | None = None, vocab: int | None = None,
                 batch: int | None = None, seq: int | None = None, trace: bool = True, snapshot: bool = True,
                 force: bool = False, append: bool = False) -> None:
        if not isinstance(model, nn.Module):  # refused before the folder is made: the loop would fail at its step
            raise ValueError(f"model: expected the torch.nn.Module being trained, got {type(model).__name__}")
        self.model = model
        self.out, unreachable = absolute_folder(checked_out(out))
        self.steps = checked_steps(steps)
        self.label, self.fused, self.head_path, self.vocab, self.batch, self.seq = checked_subject(
            label, fused, head, vocab, batch, seq)
        self.trace, self.snapshot = checked_flags(trace=trace, snapshot=snapshot, force=force, append=append)
        self.records, self.passes, self.count = [], [], 0  # RecordedStep, EvalPass; the steps counted
        self.enabled = holder.records_here()
        self._done: set[int] = set()
        self._active: StepRecording | None = None
        self._open_pass: EvalPass | None = None
        self._located = False
        self._head = self._norm = self._embedding = None
        self._lock = None
        self._admission_init()
        self.loop_alive: Callable[[], bool] | None = None  # an integration's holder.loop_probe: the loop it records
        self._stored: int | None = None  # lines of recorded_steps.jsonl, once counted
        self.closed: bool | str = False  # once closed, why it records no more (a callback then makes a new one)
        if self.enabled:  # a signal comes once the folder is held or given up; one that raises closes the recorder
            with deferred_signals.deferred(undo=lambda: StepRecorder.close(self)):
                try:
                    if unreachable is not None:  # a relative out, the current folder removed
                        raise unreachable
                    holder.close_orphans()  # the recorder of a loop that raised may hold this folder
                    self._lock = take_folder(self.out, force=force, append=append, owner=self)
                    holder.opened(self)
                except (OSError, store.FolderInUse, FolderRefused) as exc:
                    if isinstance(exc, RecordingExists):  # a recording is there: the caller must say replace or add
                        raise
                    notice(f"fusedce-profile: not recording into {one_line(self.out)}: {one_line(exc)}; "
                           "training goes on unrecorded", stacklevel=2)
                    self.enabled = False

    def close(self) -> None:
        """End an open recording and release the folder (also done when the process exits)."""
        self._change_at_most("closing", self._close)

    def _close(self) -> None:
        # said first: a step being ended meanwhile (by this handler's caller) then releases the folder itself
        # once the step is written (_end)
        self.closed = f"this StepRecorder was closed and {one_line(self.out)} released"
        if self._active is not None and not self._ending and not self._starting:  # a start ends its own
            self._end(self._active, ok=True)
        if not self._starting:  # a step being started gives it back itself, once it has stopped (_begin)
            holder.release(self)  # held with no step open
        if not self._ending:
            self._release_folder()
        self.loop_alive = None  # the probe holds the loop's frame, and with it every caller's locals
        holder.closed(self)

    def _release_folder(self) -> None:
        lock = self._lock  # forgotten once released: a signal at the release's call leaves it to the next close()
        if lock is not None:
            lock.release()  # once, though a close() and a step's end (another thread's) both come here
            self._lock = None

    # -- the public per-step API ------------------------------------------------------------
    def step(self, index: int | None = None):
        """The context of one step: records it if its index is in ``steps``, else :data:`NOOP`.

        ``index``: the step's 0-based index (default: the number of earlier :meth:`step` calls). A step of this
        thread still open (its end cut by a signal: :mod:`.left_open`) is ended unrecorded first.
        """
        index = self.count if index is None else int(index)
        self.count = index + 1
        with self._serial:
            self.end_cut_step()
            return self._recording(index) if self.wants(index) else self._refused(index)

    def start(self, index: int) -> None:
        """Begin recording step ``index`` (the callbacks' form of ``with recorder.step(index)``)."""
        with self._serial:
            self.end_cut_step()
            if not self.wants(index):
                self._refused(index)
                return
            self.count = index + 1
            rec = self._recording(index)
        if rec is not NOOP:  # begun outside this lock, as the with form's: its release is the start's own (_begin)
            self._begin(rec)

    def finish(self, loss: float | None = None) -> RecordedStep | None:
        """End the recording begun by :meth:`start` in this thread; returns its record (``None`` if none: also
        when called inside the step's own start, by a signal's handler)."""
        with self._serial:
            active = self._active
            if active is None or self._starting:
                return None
            if not active.of_this_thread() and not self._parents:  # its profiler is that thread's to stop, read
                if active.owner_alive():
                    notice(f"fusedce-profile: finish() is not for step {active.index}: another thread began it "
                           "and ends it", stacklevel=3)
                    return None
                notice(f"fusedce-profile: step {active.index} is not recorded: the thread that began it ended "
                       "without finishing it", stacklevel=3)
                self._end(active, ok=False)
                return None
            active.loss = loss if loss is not None else active.loss
            return self._end(active, ok=True)

    def abort(self) -> None:
        """End the recording begun by :meth:`start` without writing it (the step failed; from any thread)."""
        self._change_at_most("ending a step", self._abort)

    def _abort(self) -> None:
        if self._active is not None:
            self._end(self._active, ok=False)

    @property
    def recording(self) -> bool:
        return self._active is not None

    def mark(self, name: str) -> None:
        """Begin phase ``name`` of the step being recorded (a no-op otherwise): ``"loss"``,
        ``"backward"``, ``"optimizer"`` override the hooks' marks; other names add a phase."""
        if self._active is not None:
            try:
                self._active.mark(name)
            except Exception as exc:  # noqa: BLE001 - never break the user's step
                notice(f"fusedce-profile: mark({name!r}) failed: {exc}", stacklevel=2)

    def set_loss(self, loss) -> None:
        if self._active is not None and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._active.loss = float(loss.detach())

    def set_batch(self, batch) -> None:
        """Take (B, T) from a batch (the first 2-D integer tensor), for the step being recorded."""
        if self._active is not None and self._active.shape is None:
            self._active.shape = batch_shape(batch)

    # -- internals ------------------------------------------------------------------------------
    def _recording(self, index: int) -> StepRecording | contextlib.nullcontext:
        device = self.device
        if device is None:
            self._done.add(index)
            notice(f"fusedce-profile: step {index} is not recorded: the model's parameters() raised", stacklevel=3)
            return NOOP
        shape = (self.batch, self.seq) if self.batch and self.seq else None
        rec = StepRecording(index, device=device, shape=shape, begin=self._begin, end=self._end)
        rec.alive, rec.ended_if_stale = self.loop_alive, self._ended_if_stale
        return rec

    def _subject(self) -> RecordedSubject:
        return RecordedSubject(self.model, self._head, self.vocab, self.label, self.fused, self.out,
                               tuple(self.passes))

    def _abandon(self, rec: StepRecording, exc: BaseException, stacklevel: int = 4) -> None:
        notice(f"fusedce-profile: step {rec.index} is not recorded: {what_it_raised(exc)}", stacklevel=stacklevel)
        self._discard(rec, exc)

    def _discard(self, rec: StepRecording, exc: BaseException) -> None:
        """End ``rec`` without reading what it measured (each part told ``exc``, so none analyses): a step that
        failed, or a stale one ended from another thread, whose profiler events that thread cannot read. Parts stay
        named: a step discarded as it began may be discarded again once the handlers held back have run
        (:meth:`_begin`); stopping one twice is harmless."""
        rec.remove_hooks()
        for part in (rec.meter, rec.tracer):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.__exit__(type(exc), exc, None)
        if rec.snapshot is not None:
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(enabled=None)
        if self._active is rec:
            self._active = None
        holder.release(self)  # another recorder of this process may record
        self._done.add(rec.index)

    def _end(self, rec: StepRecording, ok: bool) -> RecordedStep | None:
        """End ``rec`` (recorded when ``ok``) and write it; once. A ``close()`` run meanwhile by a signal's
        handler ends nothing more, and the folder is released only once the step is written."""
        with self._serial_unless_going_on():
            if self._active is not rec or self._ending:
                return None
            self._ending = True
            try:
                with deferred_signals.deferred():  # a handler's exception comes once the step is written
                    record = self._ended(rec, ok)
                if record is not None and self.records and self.records[-1] is record:  # not held back: a report
                    try:  # may take seconds (a subclass's, any time), and the step is written
                        self.after_record(self.out)
                    except Exception as exc:  # noqa: BLE001
                        notice(f"fusedce-profile: step {rec.index} is written to {one_line(self.out)}; after_record "
                               f"raised {what_it_raised(exc)}", stacklevel=4)
                return record
            except BaseException as exc:  # as the deferral began, or a step's own: nothing of it goes on running
                if self._active is rec:
                    self._discard(rec, exc)
                holder.release(self)  # cut after the step let go of it, before it gave the recording back
                raise
            finally:
                self._ending = False
                if self.closed:  # closed meanwhile: the folder released now the step is written
                    self._release_folder()

    def _ended(self, rec: StepRecording, ok: bool) -> RecordedStep | None:
        if not ok or rec.meter is None or self._parents:  # abandoned, closed as it began, or the parent's step
            self._discard(rec, RuntimeError("the step was abandoned"))
            if ok:
                why = "this process was forked from the one that began it" if self._parents else "closed as it began"
                notice(f"fusedce-profile: step {rec.index} is not recorded: {why}", stacklevel=4)
            return None
        device = rec.device
        try:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            time_ms = (time.perf_counter() - rec.started) * 1e3
            rec.remove_hooks()
            shared = isinstance(rec.meter, SharedProfilerMeter)  # reads the tracer's finished events
            if not shared:
                rec.meter.__exit__(None, None, None)
            if rec.tracer is not None:
                rec.tracer.__exit__(None, None, None)
            if shared:
                rec.meter.__exit__(None, None, None)
            self._active = None
            holder.release(self)  # another recorder of this process may record
            self._done.add(rec.index)
            record = build_record(self._subject(), rec, device, time_ms)
        except Exception as exc:  # noqa: BLE001
            self._abandon(rec, exc, stacklevel=5)  # its caller's caller: this frame is _end's
            return None
        try:
            confined.check_folder(self.out)  # replaced or moved mid-run: nothing read or written through its path
            if self._stored is None:  # counted once: the lines earlier sessions appended
                self._stored = store.count_lines(self.out / store.RECORDED_STEPS_FILE)
            append_recorded_step(self.out, record, self._stored)
            self._stored += 1
            save_environment_once(self.out, first=not self.records)
            self.records.append(record)
        except Exception as exc:  # noqa: BLE001
            notice(f"fusedce-profile: writing step {rec.index} to {self.out} failed: {exc}", stacklevel=4)
        return record

    def after_record(self, folder: Path) -> None:
        """After each record is written into ``folder`` (a method: a bound one held frees a recorder only at gc)."""

    def after_close(self) -> None:
        """After the recorder closed itself (its loop ended with a step open: :meth:`end_stale`), what a subclass
        says at a run's end."""
