"""``StepRecorderCallback`` for ``transformers.Trainer`` (``pip install "fusedce[hf]"``).

Hooks used: ``on_train_begin`` (the folder: ``out``, else ``<args.output_dir>/fusedce-profile``;
``<folder>-2`` when a run recorded there already: :func:`~fusedce_profile.recorder.callback_recorder`;
the main process only), ``on_step_begin`` (begins recording when ``state.global_step`` is a
named step; a step spans its gradient-accumulation micro-batches), ``on_pre_optimizer_step``
(the optimizer mark), ``on_step_end`` (ends it; also notes the reserved bytes an evaluation
would start from), ``on_evaluate`` (an evaluation pass and what it left reserved). The
backward mark comes from the recorder's own ``backward()`` wrapper (``accelerate`` calls
``loss.backward()``). ``Trainer`` gives callbacks no event when a step raises: the recorder knows the
``Trainer.train`` call it was made in, and once that call has ended (an exception left it) a step it
left open ends unrecorded and the folder is released — at the process's next backward, forward or
optimizer step outside it, when another recorder begins a step, or when the process exits — and the
recorder is closed when another one is made (a new callback, or this one at the next ``train()``,
which records into a recorder of its own: ``<folder>-2`` when the first recorded a step). One
callback object records one ``train()`` at a time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from transformers import TrainerCallback

from fusedce_profile.recorder import StepRecorder, callback_arguments, callback_recorder
from fusedce_profiler.instrument.recording.holder import loop_probe
from fusedce_profiler.instrument.recording.notice import notice

FOLDER = "fusedce-profile"


class StepRecorderCallback(TrainerCallback):
    """Record training steps ``steps`` (0-based ``state.global_step`` values) of
    ``Trainer.train()`` into a run folder that ``fusedce-profile report DIR`` renders.

    ``out``: the folder (default ``<args.output_dir>/fusedce-profile``); other options as
    :class:`fusedce_profile.StepRecorder`.
    """

    def __init__(self, steps: Iterable[int] = (2,), out: str | Path | None = None, *, label: str = "",
                 fused: bool | None = None, head: str | None = None, vocab: int | None = None, trace: bool = True,
                 snapshot: bool = True, force: bool = False, append: bool = False, report: bool = True) -> None:
        self.steps, self.out = callback_arguments(steps, out, label, fused, head, vocab, trace=trace,
                                                  snapshot=snapshot, force=force, append=append, report=report)
        self.options = dict(label=label, fused=fused, head=head, vocab=vocab, trace=trace, snapshot=snapshot,
                            force=force, append=append, report=report)
        self.recorder: StepRecorder | None = None
        self.folder: Path | None = None
        self._reserved: tuple[int | None, int | None] = (None, None)

    def _note_reserved(self) -> None:
        if self.recorder is not None:
            self._reserved = self.recorder.reserved_now()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        rec, probe = self.recorder, loop_probe("transformers.", "train")  # this Trainer.train call
        if rec is not None and not rec.closed:  # left open by a train() that raised, or one still running
            self._end_open(rec, probe)
        if state.is_world_process_zero and model is not None:  # every train() is a run of its own
            folder = Path(self.out) if self.out is not None else Path(args.output_dir) / FOLDER
            self.recorder = callback_recorder(model, folder, self.steps, self.options)
            self.recorder.loop_alive = probe
            self.folder = self.recorder.out
            self._note_reserved()

    @staticmethod
    def _end_open(rec: StepRecorder, probe) -> None:
        """End the recorder an earlier loop left open: a ``train()`` that raised, the same ``train()``
        beginning its loop again (``auto_find_batch_size`` after an out-of-memory error), or — one
        callback shared by two Trainers — a ``train()`` still running in another thread."""
        again = probe is not None and getattr(rec.loop_alive, "frame", None) is probe.frame
        if again and rec.recording:
            notice("fusedce-profile: the step being recorded is not recorded: the Trainer began its loop again "
                   "inside the same train() (auto_find_batch_size after an error?)", stacklevel=3)
            rec.abort()
        elif not again and rec.loop_alive is not None and not rec.orphaned():
            notice("fusedce-profile: this StepRecorderCallback is recording a train() that still runs (another "
                   "Trainer's); a callback records one train() at a time: that one's recording ends here",
                   stacklevel=3)
            rec.abort()
        elif rec.recording:
            rec.end_stale()  # its step: unrecorded, said in one warning
        rec.close(say_unreached=not again)  # begun again, the run goes on: its steps are still to come

    def on_step_begin(self, args, state, control, **kwargs):
        rec = self.recorder
        if rec is None:
            return
        if rec.recording:  # a step that raised out of an earlier train(): it ends unrecorded
            rec.abort()
        rec.seen(state.global_step)
        if rec.wants(state.global_step):  # not while a recording is open
            rec.start(state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.recorder is not None and self.recorder.recording:
            self.recorder.mark("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        rec = self.recorder
        if rec is None:
            return
        if rec.recording:
            rec.finish()
        device = rec.device
        if device is not None and device.type == "cuda":
            self._note_reserved()

    def on_evaluate(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.add_pass("evaluation", state.global_step, *self._reserved)
            self._note_reserved()

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.close()


__all__ = ["StepRecorderCallback"]
