"""The public recorder: :class:`fusedce_profiler.instrument.recording.StepRecorder` that also renders the report.

The measuring is :mod:`fusedce_profiler.instrument.recording`; this layer adds what the profiler must not do
itself (it never imports the renderers): after each recorded step the folder's
``summary.md`` and plots are rebuilt by :func:`write_report` (``report=False`` skips it;
``fusedce-profile report DIR`` does the same later, anywhere).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument.recording.folder import RecordingExists
from fusedce_profiler.instrument.recording.recorder import StepRecorder as _ProfilerStepRecorder
from fusedce_profiler.instrument.recording.arguments import checked_flags, checked_out, checked_steps, checked_subject
from fusedce_profiler.instrument.recording.notice import notice, to_stderr
from fusedce_profiler.instrument.text import one_line, shell_word


def write_report(folder: str | Path) -> Path:
    """Render the recorded folder's ``summary.md`` and ``plots/``; returns the summary's path."""
    from fusedce_reports.recorded_report import write_recorded_report

    return write_recorded_report(folder)


def _render(folder: Path) -> bool:
    try:
        write_report(folder)
        return True
    except Exception as exc:  # noqa: BLE001 - a report failure must not stop the training
        notice(f"fusedce-profile: the report of {folder} was not rendered: {exc} "
               f"(run `fusedce-profile report {shell_word(folder)}`)", stacklevel=2)
        return False


def say(line: str) -> None:
    """One line of the recorder to the user's standard error (their training output), dropped when that
    cannot be written."""
    to_stderr(f"fusedce-profile: {one_line(line)}")


class StepRecorder(_ProfilerStepRecorder):
    """Record the named steps of a training loop into ``out`` (see
    :class:`fusedce_profiler.instrument.recording.StepRecorder` for every option)::

        recorder = StepRecorder(model, "runs/own", steps=(2, 50), label="fused")
        for batch in loader:
            with recorder.step():
                loss = my_loss(model, batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

    On the steps not named, ``step()`` is a counter check that returns a reusable no-op
    context: no hook, no profiler. ``report``: render ``summary.md`` after each recorded step.
    Each recorded step prints one line saying where it was written; :meth:`close` prints one
    line per requested step the run never reached (standard error, rank 0 only).
    """

    def __init__(self, model, out, *, report: bool = True, **options) -> None:
        arguments.flag(report, "report")  # before the folder is taken
        try:
            super().__init__(model, out, **options)
        except ValueError as exc:  # a bad argument, named, before anything is written: this API's error
            if hasattr(self, "enabled"):  # raised past the argument checks: a signal handler's own, as it is
                raise
            raise UsageError(str(exc)) from None
        self.report = report
        self._closed = False

    def after_record(self, folder: Path) -> None:
        """After each recorded step: render the report, say in one line where the step went."""
        where = folder / "summary.md" if self.report and _render(folder) else folder
        say(f"step {self.records[-1].step} recorded in {where}")

    def close(self, *, say_unreached: bool = True) -> None:
        """End an open recording, release the folder, and say which requested steps the run
        never reached (once, however often it is called; not with ``say_unreached=False``: a run
        that goes on in a recorder of its own)."""
        arguments.flag(say_unreached, "say_unreached")
        super().close()
        if not say_unreached:
            self._closed = True  # nothing to say, now or later
        self.after_close()

    def after_close(self) -> None:
        """Say which requested steps the run never reached, once (also when the recorder closed itself: its loop
        ended with a step open)."""
        if self._closed or not self.enabled:
            return
        self._closed = True
        ran = f"the run ended after step {self.count - 1}" if self.count else "no step ran"
        for step in self.unreached():
            say(f"step {step} was never reached ({ran}); nothing was recorded for it")


def _free_sibling(folder: Path) -> Path:
    """``<folder>-2`` (``-3`` … if that exists already)."""
    n = 2
    while os.path.lexists(candidate := folder.with_name(f"{folder.name}-{n}")):
        n += 1
    return candidate


def callback_arguments(steps: Iterable[int], out: str | os.PathLike | None, label: str = "", fused: bool | None = None,
                       head: str | None = None, vocab: int | None = None, report: object = True,
                       **flags: object) -> tuple[tuple[int, ...], str | None]:
    """A callback's ``steps`` and ``out`` (None: the trainer's folder), and the options it hands its
    recorder (``report``; ``flags``: trace, snapshot, force, append), checked when the callback is made as
    :class:`StepRecorder` checks them: :class:`~fusedce_profile.errors.UsageError` naming the argument,
    never an error in the middle of ``fit``."""
    try:
        checked_subject(label, fused, head, vocab, None, None)
        checked_flags(**flags)
        arguments.flag(report, "report")
        return tuple(sorted(checked_steps(steps))), None if out is None else checked_out(out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def callback_recorder(model, folder: Path, steps, options: dict) -> StepRecorder:
    """The recorder of a training callback (Lightning, Hugging Face): into ``folder``, or — when
    ``folder`` already holds a recording and the options say neither ``force`` nor ``append`` (a
    second run with the same settings) — into a fresh folder beside it, ``<folder>-2`` (``-3`` …),
    said in one warning. A callback never stops the training it profiles."""
    try:
        return StepRecorder(model, folder, steps=steps, **options)
    except RecordingExists:
        fresh = _free_sibling(folder)
        notice(f"fusedce-profile: {folder} already holds a recording; this run is recorded in {fresh} "
               "(pass force=True to replace it, or append=True to add to it)", stacklevel=3)
        return StepRecorder(model, fresh, steps=steps, **options)


@contextlib.contextmanager
def record_step(model, out, *, step: int = 0, **options):
    """Record the one step inside the ``with`` block into ``out``; yields the recorder (for
    ``recorder.mark("backward")``). ``step`` is the index stored for it; other options as
    :class:`StepRecorder`::

        with record_step(model, "runs/step2", step=2, label="fused"):
            loss = my_loss(model, batch); loss.backward(); optimizer.step()
    """
    recorder = StepRecorder(model, out, steps=(step,), **options)
    try:
        with recorder.step(step):
            yield recorder
    finally:
        recorder.close()
