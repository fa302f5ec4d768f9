"""Recording a training step inside the user's own loop (the public face is :mod:`fusedce_profile`).

- :mod:`~profiler.recording.recorder`: :class:`StepRecorder`.
- :mod:`~profiler.recording.records`: what a recorded step stores (:class:`RecordedStep`).
"""
from profiler.recording.recorder import NOOP, StepRecorder
from profiler.recording.records import EvalPass, PhaseMemory, RecordedStep, load_recorded_steps

__all__ = ["NOOP", "StepRecorder", "EvalPass", "PhaseMemory", "RecordedStep", "load_recorded_steps"]
