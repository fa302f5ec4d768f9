"""The instrument: how every figure of memory, time and parity is taken and stored.

- :mod:`~fusedce_profiler.instrument.protocol`: the measurement protocol (settle, phase meters, timing).
- :mod:`~fusedce_profiler.instrument.worker`: measurements run in child processes, never in the parent.
- :mod:`~fusedce_profiler.instrument.store`: the run folder on disk, one reader and one writer.
- :mod:`~fusedce_profiler.instrument.records`: the records a grid run stores.
- :mod:`~fusedce_profiler.instrument.backends`: the LM-head losses measured, behind one interface.
- :mod:`~fusedce_profiler.instrument.models`: model configurations and sources (built-in, HF, user factory).
- :mod:`~fusedce_profiler.instrument.step`: one measured training step and where its peak goes.
- :mod:`~fusedce_profiler.instrument.tracing`: the traced peak, attributed by module and kind.
- :mod:`~fusedce_profiler.instrument.recording`: a step recorded inside the user's own loop.

Nothing here judges: verdicts built on these measurements live in :mod:`fusedce_profiler.judgements`.
"""
