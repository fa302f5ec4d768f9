"""The public recorder: :class:`fusedce_profiler.instrument.recording.StepRecorder` that also renders the report.

The measuring is :mod:`fusedce_profiler.instrument.recording`; this layer adds what the profiler must not do
itself (it never imports the renderers): after each recorded step the folder's
``summary.md`` and plots are rebuilt by :func:`write_report` (``report=False`` skips it;
``fusedce-profile report DIR`` does the same later, anywhere).
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

from fusedce_profiler.instrument.recording.recorder import StepRecorder as _ProfilerStepRecorder


def write_report(folder: str | Path) -> Path:
    """Render the recorded folder's ``summary.md`` and ``plots/``; returns the summary's path."""
    from fusedce_reports.recorded_report import write_recorded_report

    return write_recorded_report(folder)


def _render(folder: Path) -> None:
    try:
        write_report(folder)
    except Exception as exc:  # noqa: BLE001 - a report failure must not stop the training
        warnings.warn(f"fusedce-profile: the report of {folder} was not rendered: {exc} "
                      f"(run `fusedce-profile report {folder}`)", RuntimeWarning, stacklevel=2)


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
    """

    def __init__(self, model, out, *, report: bool = True, **options) -> None:
        super().__init__(model, out, on_record=_render if report else None, **options)


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
