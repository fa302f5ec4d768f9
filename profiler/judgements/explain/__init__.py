"""``explain``: which configurations are consistent with a user's two ``nvidia-smi`` readings.

- :mod:`~fusedce_profiler.judgements.explain.records`: the readings, hypotheses and the stored explanation.
- :mod:`~fusedce_profiler.judgements.explain.calibration`: the small measured steps the predictions rest on.
- :mod:`~fusedce_profiler.judgements.explain.verdict`: hypotheses ranked against the readings, and confirmed.
- :mod:`~fusedce_profiler.judgements.explain.conclusion`: what remains, and the run that would separate it.
"""
