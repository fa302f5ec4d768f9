"""Model sources: the models a training step can be measured on.

- :mod:`~fusedce_profiler.instrument.models.gpt`: the built-in GPT-style decoder, built from a
  :class:`~fusedce_profiler.instrument.models.configs.ModelConfig` (no extra dependency; the CPU workhorse).
"""
from fusedce_profiler.instrument.models.gpt import ATTENTION_IMPLS, GPT

__all__ = ["ATTENTION_IMPLS", "GPT"]
