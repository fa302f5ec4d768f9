"""How a recorded step begins: the process's one recording taken, the landmarks found once, parts started.

A step begins inside :meth:`StepBeginning._begin`, under the recorder's lock, with the main thread's signals held
back (:mod:`fusedce_profiler.instrument.deferred_signals`): a handler's exception — Ctrl-C, a watchdog's
``TimeoutError`` — comes once the step has begun whole, then ends it unrecorded and goes on to the caller; it is
never taken for the recorder's own failure (which is said and lets the step run unrecorded), and never cuts the head
search or a part's start in two. A handler that closed the recorder or ended the step meanwhile has its way once it
has run: what began is stopped. Signals stay held back over the recorder's lock's release: under a traced step's
profiler a handler may run inside the profiler's hook as a C function is called, and its exception then stops that
call — the release — leaving the lock held for good.

Public API: :class:`StepBeginning` (a part of :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`).
"""
from __future__ import annotations

import contextlib
import time

import torch

from fusedce_profiler.instrument import deferred_signals
from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.instrument.recording import holder
from fusedce_profiler.instrument.recording.landmarks import find_embedding, find_final_norm, find_head
from fusedce_profiler.instrument.recording.notice import notice
from fusedce_profiler.instrument.recording.phases import CudaPhaseMeter, SharedProfilerMeter, StepRecording
from fusedce_profiler.instrument.tensors import tensor_bytes


class StepBeginning:
    """A recorder's step start. The recorder provides ``model``, ``trace``, ``snapshot``, ``head_path``, ``vocab``,
    ``closed``, ``_active``, ``_done``, ``_ending``, ``_starting``, ``_located``, ``_serial``, :meth:`wants`,
    :meth:`_refused`, :meth:`reserved_now`, :meth:`_abandon`, :meth:`_discard` and :meth:`_end`."""

    def _locate(self) -> None:
        """Find the head, final norm and embedding, once (a step's start: signals held back). The head is probed
        under ``torch.no_grad``; the gradient mode is put back whatever the probe raises (said by the step)."""
        if self._located:
            return
        self._located, grad = True, torch.is_grad_enabled()
        try:
            try:
                self._head = find_head(self.model, vocab=self.vocab, head_path=self.head_path)
            except ValueError as exc:
                notice(f"fusedce-profile: {exc}", stacklevel=6)  # at the user's step (_start, its callers, the step)
                self._head = None
            self.vocab = self.vocab or (self._head.info.vocab if self._head else None)
            self._norm = find_final_norm(self.model, self._head)
            self._embedding = find_embedding(self.model, self.vocab)
        finally:  # gradients left off would train nothing
            torch._C._set_grad_enabled(grad)

    def _begin(self, rec: StepRecording) -> None:
        try:  # around the whole: a signal's exception landing as the lock's release returns (the step begun) too
            with contextlib.ExitStack() as over_the_release, self._serial:  # the stack left last: handlers held
                if self.closed:  # back over the lock's release; since step() said yes, closed (another thread's
                    self.wants(rec.index)  # close(), or a signal's handler's), which wants() says, once
                    return
                if rec.index in self._done or self._ending or (self._active is not None and not self._starting):
                    self._refused(rec.index, stacklevel=5)  # since step() said yes, another thread began a step or
                    return  # recorded this one; or a signal's handler asks for it inside this thread's step's end
                self._starting += 1  # a count: a signal's handler may begin another inside this one
                try:  # a handler's exception (Ctrl-C, a watchdog's) comes once the step has begun, then ends it
                    with deferred_signals.deferred(undo=lambda: self._discard(rec, RuntimeError("a signal came"))):
                        began = self._take_and_start(rec)
                    if began:  # the handlers that came have run: one may have closed the recorder or ended the step
                        over_the_release.enter_context(deferred_signals.deferred())
                        self._stopped_if_closed(rec)
                except BaseException as exc:  # raised as a deferral began: the step, if it began, ends unrecorded
                    if self._active is rec:
                        self._discard(rec, exc)
                    holder.release(self)
                    raise
                finally:
                    self._starting -= 1
                    if self.closed and not self._starting:  # closed meanwhile (close() left the recording to it)
                        holder.release(self)
        except BaseException:  # the step, if it began, ends unrecorded (one that never began is not waited for)
            if rec.started is not None:
                self._end(rec, ok=False)
            raise

    def _take_and_start(self, rec: StepRecording) -> bool:
        """Take the process's one recording and start ``rec``: whether it began (else it is said why not)."""
        try:  # from the taking on: a step's own BaseException gives the recording back (_discard)
            if not holder.take(self):
                notice(f"fusedce-profile: step {rec.index} is not recorded: another StepRecorder is recording a "
                       "step in this process (one step is recorded at a time)", stacklevel=4)
                self._done.add(rec.index)
                return False
            self._start(rec)
            return True
        except Exception as exc:  # noqa: BLE001 - the user's step must run whatever happens here
            self._abandon(rec, exc, stacklevel=5)  # said at the user's step: this frame, _begin's, and the step's
            return False
        except BaseException as exc:  # the head's own KeyboardInterrupt: the step ends unrecorded, it goes on
            self._discard(rec, exc)
            raise

    def _stopped_if_closed(self, rec: StepRecording) -> None:
        if self.closed:  # a signal's handler closed the recorder as the step began: what began is stopped
            notice(f"fusedce-profile: step {rec.index} is not recorded: closed as it began", stacklevel=4)
            self._discard(rec, RuntimeError("the recorder was closed as the step began"))
        elif self._active is not rec:  # a signal's handler ended the step
            self._discard(rec, RuntimeError("the step was ended as it began"))

    def _start(self, rec: StepRecording) -> None:
        from fusedce_profiler.instrument.snapshot import SnapshotRecorder
        from fusedce_profiler.instrument.tracing.trace import StepTracer

        device = rec.device
        self._locate()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        params = list(self.model.parameters())
        rec.parameters = tensor_bytes(params)
        rec.gradients = tensor_bytes(p.grad for p in params)
        rec.reserved_at_start, rec.max_reserved_before = self.reserved_now()
        rec.started = time.perf_counter()
        self._active = rec
        if self.trace:  # before the hooks: the profiler's first start imports torch._dynamo, which would keep
            rec.tracer = StepTracer().__enter__()  # the backward wrappers (and the model) for good
        rec.install(self.model, self._head, self._norm, self._embedding)
        if device.type == "cuda" and self.snapshot:
            rec.snapshot = SnapshotRecorder(device)
            rec.snapshot.start()
        if device.type == "cuda":
            rec.meter = CudaPhaseMeter(device)
        elif rec.tracer is not None:
            rec.meter = SharedProfilerMeter(device, rec.parameters + rec.gradients, rec.tracer)
        else:
            rec.meter = MemoryMeter(device, baseline_bytes=rec.parameters + rec.gradients)
        rec.meter.__enter__()
        rec.mark("forward")
