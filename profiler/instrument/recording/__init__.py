"""Recording a training step inside the user's own loop (the public face is :mod:`fusedce_profile`).

- :mod:`~fusedce_profiler.instrument.recording.recorder`: :class:`StepRecorder` (which steps are recorded, the run
  folder, evaluation passes).
- :mod:`~fusedce_profiler.instrument.recording.folder`: the folder it records into, checked and locked.
- :mod:`~fusedce_profiler.instrument.recording.phases`: the hooks and meters of one recorded step.
- :mod:`~fusedce_profiler.instrument.recording.landmarks`: the LM head, final norm and embedding in the user's model.
- :mod:`~fusedce_profiler.instrument.recording.assemble`: the record of a finished step (peak, notes, attribution).
- :mod:`~fusedce_profiler.instrument.recording.records`: what a recorded step stores (:class:`RecordedStep`).
"""
from fusedce_profiler.instrument.recording.recorder import NOOP, StepRecorder
from fusedce_profiler.instrument.recording.records import EvalPass, PhaseMemory, RecordedStep, load_recorded_steps

__all__ = ["NOOP", "StepRecorder", "EvalPass", "PhaseMemory", "RecordedStep", "load_recorded_steps"]
