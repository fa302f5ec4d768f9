"""Model sources: the models a training step can be measured on.

- :mod:`~profiler.models.gpt`: the built-in GPT-style decoder, built from a
  :class:`~profiler.configs.ModelConfig` (no extra dependency; the CPU workhorse).
"""
from profiler.models.gpt import ATTENTION_IMPLS, GPT

__all__ = ["ATTENTION_IMPLS", "GPT"]
