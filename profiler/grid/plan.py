"""A run's plan: every cell it sets out to measure (``plan.json``), stored before it measures any,
so that a report can say how much of it is missing.

Public API: :func:`save_plan`, :func:`planned_cells`, :func:`planned_cells_and_timing`.
"""
from __future__ import annotations

from pathlib import Path

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.capacity import MAX_CELLS
from fusedce_profiler.instrument.planned import load_plan, load_planned, save_planned
from fusedce_profiler.instrument.records import CellSpec


def save_plan(folder: str | Path, cells: list[CellSpec], timing: dict | None = None) -> Path:
    """Store the cells a run sets out to measure (``plan.json``), before it measures any, with
    ``timing`` (``{"warmup": W, "repeats": R}``: what every cell is timed with; a cell's row does not
    say it)."""
    return save_planned(folder, store.PLAN_FILE, "cells", cells, timing)


def planned_cells_and_timing(folder: str | Path) -> tuple[list[CellSpec], dict | None] | None:
    """The cells of ``plan.json`` and the timing stored with them (:func:`save_plan`; ``None`` when it
    holds none), read once; ``None`` when there is no plan; ``ValueError`` as :func:`planned_cells`."""
    return load_plan(folder, store.PLAN_FILE, "cells", CellSpec.from_dict, MAX_CELLS)


def planned_cells(folder: str | Path) -> list[CellSpec] | None:
    """The cells of ``plan.json``; ``None`` when there is none; ``ValueError`` naming the file
    when it cannot be read as a plan."""
    return load_planned(folder, store.PLAN_FILE, "cells", CellSpec.from_dict, MAX_CELLS)
