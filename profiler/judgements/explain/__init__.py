"""``explain``: which configurations are consistent with a user's two ``nvidia-smi`` readings.

- :mod:`~fusedce_profiler.judgements.explain.records`: the readings, hypotheses and the stored explanation.
- :mod:`~fusedce_profiler.judgements.explain.readings`: impossible input, refused before any work.
- :mod:`~fusedce_profiler.judgements.explain.calibration`: the measured steps, one line in B per phase.
- :mod:`~fusedce_profiler.judgements.explain.allocator`: allocated bytes → ``nvidia-smi`` on the user's card,
  with the tolerance of each term.
- :mod:`~fusedce_profiler.judgements.explain.verdict`: hypotheses scored on the naive reading and the saving,
  and confirmed at full size under the card's cap.
- :mod:`~fusedce_profiler.judgements.explain.others`: other causes (optimizer peak, eval cache, the cap,
  another process) and the families ruled out at every batch size.
- :mod:`~fusedce_profiler.judgements.explain.conclusion`: what remains, and the run that would separate it.
"""
