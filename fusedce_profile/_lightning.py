"""The Lightning callback, built on the ``Callback`` class of ``lightning.pytorch`` or of
``pytorch_lightning`` (a Trainer accepts only its own package's callbacks).

Hooks used: ``setup`` (the folder: ``out``, else ``<trainer.log_dir or default_root_dir>/
fusedce-profile``; ``<folder>-2`` when a run recorded there already:
:func:`~fusedce_profile.recorder.callback_recorder`; rank 0 only), ``on_validation_start``/``on_validation_end`` (every pass,
the sanity check included, with the allocator's reserved bytes around it),
``on_train_batch_start`` (begins recording when ``trainer.global_step`` is a named step),
``on_before_backward`` (the loss value; the backward mark), ``on_before_optimizer_step`` (the
optimizer mark: with automatic optimisation the forward and backward run inside
``optimizer.step(closure)``), ``on_train_batch_end`` (ends the recording once the optimizer
stepped, so a step spans all its accumulated micro-batches), ``on_exception`` and
``teardown`` (which closes the recorder: one line per requested step the fit never reached).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Iterable

from fusedce_profile.recorder import StepRecorder, callback_arguments, callback_recorder

FOLDER = "fusedce-profile"


def make_callback_class(package: str):
    """``StepRecorderCallback`` subclassing ``<package>.Callback`` (``lightning.pytorch`` or
    ``pytorch_lightning``)."""
    pl = importlib.import_module(package)

    class StepRecorderCallback(pl.Callback):
        """Record training steps ``steps`` (0-based ``trainer.global_step`` values) of
        ``Trainer.fit`` into a run folder that ``fusedce-profile report DIR`` renders.

        ``out``: the folder (default ``<trainer.log_dir>/fusedce-profile``); ``label``,
        ``fused``, ``head``, ``vocab``, ``trace``, ``snapshot``, ``force``, ``append``,
        ``report``: as :class:`fusedce_profile.StepRecorder`. Works with any ``precision``
        (``"bf16-mixed"`` included) and records what the sanity check and every validation pass
        leave reserved before each recorded step.
        """

        def __init__(self, steps: Iterable[int] = (2,), out: str | Path | None = None, *, label: str = "",
                     fused: bool | None = None, head: str | None = None, vocab: int | None = None,
                     trace: bool = True, snapshot: bool = True, force: bool = False, append: bool = False,
                     report: bool = True) -> None:
            super().__init__()
            self.steps, self.out = callback_arguments(steps, out, label, fused, head, vocab, trace=trace,
                                                      snapshot=snapshot, force=force, append=append, report=report)
            self.options = dict(label=label, fused=fused, head=head, vocab=vocab, trace=trace, snapshot=snapshot,
                                force=force, append=append, report=report)
            self.recorder: StepRecorder | None = None
            self.folder: Path | None = None
            self._step: int | None = None

        def setup(self, trainer, pl_module, stage: str) -> None:
            open_already = self.recorder is not None and not self.recorder.closed  # one an earlier fit closed:
            if stage != "fit" or open_already or not trainer.is_global_zero:  # a second run, recorded beside it
                return
            root = Path(self.out) if self.out is not None else Path(trainer.log_dir or trainer.default_root_dir) / FOLDER
            self.recorder = callback_recorder(pl_module, root, self.steps, self.options)
            self.folder = self.recorder.out

        def on_validation_start(self, trainer, pl_module) -> None:
            if self.recorder is not None:
                self.recorder.begin_pass("sanity check" if trainer.sanity_checking else "validation",
                                         trainer.global_step)

        def on_validation_end(self, trainer, pl_module) -> None:
            if self.recorder is not None:
                self.recorder.end_pass()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            rec = self.recorder
            if rec is not None:
                rec.seen(trainer.global_step)
            if rec is None or rec.recording or not rec.wants(trainer.global_step):
                return
            self._step = trainer.global_step
            rec.start(trainer.global_step)
            rec.set_batch(batch)

        def on_before_backward(self, trainer, pl_module, loss) -> None:
            if self.recorder is not None and self.recorder.recording:
                self.recorder.set_loss(loss)
                self.recorder.mark("backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            if self.recorder is not None and self.recorder.recording:
                self.recorder.mark("optimizer")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            rec = self.recorder
            if rec is not None and rec.recording and trainer.global_step > self._step:
                rec.finish()

        def on_exception(self, trainer, pl_module, exception) -> None:
            if self.recorder is not None:  # Lightning runs no teardown hook after an exception
                self.recorder.abort()
                self.recorder.close()

        def teardown(self, trainer, pl_module, stage: str) -> None:
            if stage == "fit" and self.recorder is not None:
                self.recorder.close()

    StepRecorderCallback.__module__ = f"fusedce_profile.{package.split('.')[0]}"
    return StepRecorderCallback
