"""Model sources: the models a training step can be measured on.

- :mod:`~fusedce_profiler.instrument.models.gpt`: the built-in GPT-style decoder, built from a
  :class:`~fusedce_profiler.instrument.models.configs.ModelConfig` (no extra dependency; the CPU workhorse).
- :mod:`~fusedce_profiler.instrument.models.configs` and ``options``: its shapes and the
  command-line choice of a model, read without importing torch.
"""
