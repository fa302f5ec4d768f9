"""A run's plan: every cell it sets out to measure (``plan.json``), stored before it measures any,
so that a report can say how much of it is missing.

Public API: :func:`save_plan`, :func:`planned_cells`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.records import CellSpec


def save_plan(folder: str | Path, cells: list[CellSpec]) -> Path:
    """Store the cells a run sets out to measure (``plan.json``), before it measures any."""
    return store.write_json(Path(folder) / store.PLAN_FILE, {"cells": [asdict(spec) for spec in cells]})


def planned_cells(folder: str | Path) -> list[CellSpec] | None:
    """The cells of ``plan.json``; ``None`` when there is none; ``ValueError`` naming the file
    when it cannot be read as a plan."""
    path = Path(folder) / store.PLAN_FILE
    if not store.present(path):
        return None
    raw = store.read_json(path)
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
            raise ValueError("expected an object with a list of cells")
        return [CellSpec.from_dict(cell) for cell in raw["cells"]]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a plan of cells ({exc})") from None
