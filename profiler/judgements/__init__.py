"""Judgements built on measurements: each reads what the instrument measured and says what it means.

- :mod:`~fusedce_profiler.judgements.parity`: does a fused loss train the model as eager torch does?
- :mod:`~fusedce_profiler.judgements.doctor`: is a user's loss wrapper wired to the model correctly?
- :mod:`~fusedce_profiler.judgements.explain`: which configurations explain two ``nvidia-smi`` readings?
- :mod:`~fusedce_profiler.judgements.fit`: the largest batch or sequence that fits a memory limit.

No judgement imports another's internals; all of them import the instrument.
"""
