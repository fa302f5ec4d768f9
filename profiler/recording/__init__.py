"""Recording a training step inside the user's own loop (the public face is :mod:`fusedce_profile`).

- :mod:`~profiler.recording.recorder`: :class:`StepRecorder` (which steps are recorded, the run
  folder, evaluation passes).
- :mod:`~profiler.recording.phases`: the hooks and meters of one recorded step.
- :mod:`~profiler.recording.landmarks`: the LM head, final norm and embedding in the user's model.
- :mod:`~profiler.recording.assemble`: the record of a finished step (peak, notes, attribution).
- :mod:`~profiler.recording.records`: what a recorded step stores (:class:`RecordedStep`).
"""
from profiler.recording.recorder import NOOP, StepRecorder
from profiler.recording.records import EvalPass, PhaseMemory, RecordedStep, load_recorded_steps

__all__ = ["NOOP", "StepRecorder", "EvalPass", "PhaseMemory", "RecordedStep", "load_recorded_steps"]
