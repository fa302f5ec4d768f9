"""The grid: loss back-ends measured cell by cell (tokens × head × mode), each cell in a worker.

- :mod:`~fusedce_profiler.grid.spec`: what the user asks to measure, validated and expanded into cells.
- :mod:`~fusedce_profiler.grid.inputs`: the deterministic inputs of a cell.
- :mod:`~fusedce_profiler.grid.cell`: one cell measured in the current process.
- :mod:`~fusedce_profiler.grid.runner`: a whole grid, each result appended to the run folder.
- :mod:`~fusedce_profiler.grid.plan`: the cells a run sets out to measure (``plan.json``).
- :mod:`~fusedce_profiler.grid.memory_model`: the predicted peak of each cell, beside the measured one.
"""
