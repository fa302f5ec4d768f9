"""What a run may set out to write: the readers' limits (:mod:`fusedce_profiler.instrument.confined`)
turned into bounds on a run, checked before it starts, so that a run never writes a folder its own
``report`` would refuse.

A grid writes one row of ``results.jsonl`` per cell, each holding its ``repeats`` timings, and a
``plan.json`` of every cell; ``parity`` writes every training step's loss of every curve into
``parity.json``; a recorder appends one line per recorded step to ``recorded_steps.jsonl``.
The byte counts below are upper bounds of what the writers produce (a row is ~1.2 KB without its
timings; a number, indented, at most ~25 bytes).

Public API: :data:`MAX_CELLS`, :data:`MAX_RECORDED_STEPS`, :func:`grid_problem`, :func:`parity_problem`.
"""
from __future__ import annotations

from fusedce_profiler.instrument import confined, store

ROW_BYTES = 4 << 10
"""A result row without its timings, at most (a back-end's message is one line)."""

NUMBER_BYTES = 32
"""One stored number of a list (a timing, a loss), with its separator and indentation, at most."""

PLAN_CELL_BYTES = 1 << 10
"""One cell of ``plan.json``, at most (a back-end name of a few hundred characters included)."""

MAX_CELLS = min(confined.MAX_LINES,
                confined.size_limit(store.PLAN_FILE) // PLAN_CELL_BYTES)
"""The most cells a grid may have: one row each of ``results.jsonl`` and one entry each of ``plan.json``."""

MAX_RECORDED_STEPS = confined.MAX_LINES
"""The most steps recorded into one folder: one line each of ``recorded_steps.jsonl``."""


def grid_problem(cells: int, repeats: int) -> str | None:
    """Why a grid of ``cells`` cells timed ``repeats`` times each would write more than its folder's
    readers read (``None`` when it would not)."""
    if cells > MAX_CELLS:
        return (f"the grid has {cells:,} cells, more than the {MAX_CELLS:,} a run folder holds "
                f"(one line each of {store.RESULTS_FILE}): split it into several runs")
    row = ROW_BYTES + repeats * NUMBER_BYTES
    if row > confined.MAX_LINE_BYTES:
        return (f"--repeats {repeats}: a result row would be over the {confined.MAX_LINE_BYTES:,}-byte limit of "
                f"a line of {store.RESULTS_FILE}; use at most {(confined.MAX_LINE_BYTES - ROW_BYTES) // NUMBER_BYTES:,}")
    limit = confined.size_limit(store.RESULTS_FILE)
    if cells * row > limit:
        return (f"{cells:,} cells of --repeats {repeats} timings each would make {store.RESULTS_FILE} over its "
                f"{limit:,}-byte limit: use fewer repeats or fewer cells")
    return None


def parity_problem(curves: int, steps: int) -> str | None:
    """Why ``curves`` training runs of ``steps`` steps would make ``parity.json`` larger than its
    reader reads (``None`` when they would not)."""
    limit = confined.size_limit(store.PARITY_FILE)
    if curves * steps * NUMBER_BYTES + ROW_BYTES * curves > limit:
        return (f"--steps {steps} for {curves} training runs would make {store.PARITY_FILE} over its {limit:,}-byte "
                f"limit (every step's loss is stored): use at most {(limit // curves - ROW_BYTES) // NUMBER_BYTES:,} steps")
    return None
