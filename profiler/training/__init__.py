"""Whole training steps, not just the loss: a model trained with each loss back-end.

- :mod:`~profiler.training.step`: one measured training step and the composition of its peak.
- :mod:`~profiler.training.jobs`: a step as a job, run here or in a worker process.
- :mod:`~profiler.training.fit`: the largest batch or sequence length under a memory limit.
- :mod:`~profiler.training.data` / :mod:`~profiler.training.parity`: training parity on
  Markov-chain data.
- :mod:`~profiler.training.doctor`: checks of a user's loss wrapper (the run and its records);
  :mod:`~profiler.training.doctor_runs` observes one loss call,
  :mod:`~profiler.training.doctor_variants` the reference and its known mistakes,
  :mod:`~profiler.training.doctor_checks` judges each check.
- :mod:`~profiler.training.losses`: the loss back-ends as a training step calls them.

The models come from :mod:`profiler.models`; the reports are rendered by :mod:`reports`.
"""
from profiler.training.doctor import Check, run_doctor
from profiler.training.fit import FitResult, FitSearch, fit_backend, largest_fitting
from profiler.training.jobs import ModelJob, ModelResult, run_job, run_job_in_worker
from profiler.training.parity import ParityReport, ParitySettings, run_parity
from profiler.training.step import StepMemory, measure_step

__all__ = [
    "ModelJob", "ModelResult", "run_job", "run_job_in_worker", "StepMemory", "measure_step",
    "FitResult", "FitSearch", "fit_backend", "largest_fitting", "ParitySettings", "ParityReport", "run_parity",
    "Check", "run_doctor",
]
