"""A model run's plan: every job it sets out to measure (``model_plan.json``), stored before it
measures any, so that a ``--resume`` given other options is refused before it drops the jobs the
first run had not finished (as a grid's ``plan.json`` does for its cells).

Public API: :func:`save_model_plan`, :func:`planned_jobs`.
"""
from __future__ import annotations

from pathlib import Path

from fusedce_profiler.instrument import confined, store
from fusedce_profiler.instrument.planned import load_planned, save_planned
from fusedce_profiler.instrument.step.jobs import ModelJob


def save_model_plan(folder: str | Path, jobs: list[ModelJob]) -> Path:
    """Store the jobs a model run sets out to measure (``model_plan.json``), before it measures any."""
    return save_planned(folder, store.MODEL_PLAN_FILE, "jobs", jobs)


def planned_jobs(folder: str | Path) -> list[ModelJob] | None:
    """The jobs of ``model_plan.json``; ``None`` when there is none; ``ValueError`` naming the file
    when it cannot be read as a plan."""
    return load_planned(folder, store.MODEL_PLAN_FILE, "jobs", ModelJob.from_dict, confined.MAX_LINES)

