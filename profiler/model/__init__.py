"""Model mode (issue 7): a GPT-style decoder trained with each loss back-end.

- :mod:`~profiler.model.gpt`: the decoder built from a :class:`~profiler.configs.ModelConfig`.
- :mod:`~profiler.model.step`: one measured training step and the composition of its peak.
- :mod:`~profiler.model.memory`: phase-by-phase memory accounting (CUDA allocator or CPU profiler).
- :mod:`~profiler.model.run` / :mod:`~profiler.model.worker`: jobs, each in its own process.
- :mod:`~profiler.model.fit`: the largest batch or sequence length under a memory limit.
- :mod:`~profiler.model.data` / :mod:`~profiler.model.parity`: training parity on Markov-chain data.
- :mod:`~profiler.model.doctor`: checks of a user's loss wrapper.
- :mod:`~profiler.model.report`: the report folder.
"""
from profiler.model.doctor import Check, run_doctor
from profiler.model.fit import FitResult, FitSearch, fit_backend, largest_fitting
from profiler.model.gpt import GPT
from profiler.model.parity import ParityReport, ParitySettings, run_parity
from profiler.model.run import ModelJob, ModelResult, run_job, run_job_subprocess
from profiler.model.step import StepMemory, measure_step

__all__ = [
    "GPT", "ModelJob", "ModelResult", "run_job", "run_job_subprocess", "StepMemory", "measure_step",
    "FitResult", "FitSearch", "fit_backend", "largest_fitting", "ParitySettings", "ParityReport", "run_parity",
    "Check", "run_doctor",
]
