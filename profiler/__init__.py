"""The profiler: the measurements of LM-head losses, and the judgements built on them.

Three layers, each a folder (installed as ``fusedce_profiler``):

- :mod:`fusedce_profiler.instrument` — how a figure is taken and stored: the protocol, worker
  processes, the run folder, the loss back-ends, model sources, the measured training step,
  tracing and attribution, recording a step inside the user's own loop.
- :mod:`fusedce_profiler.judgements` — verdicts read from measurements: parity, doctor,
  explain, fit.
- :mod:`fusedce_profiler.grid` — loss back-ends measured cell by cell.

Reports are rendered by :mod:`fusedce_reports` from the stored files alone; the public Python
face of every command is :mod:`fusedce_profile`.
"""
