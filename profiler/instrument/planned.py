"""What a run sets out to measure, stored before it measures any of it: a grid's cells
(``plan.json``), a model run's jobs (``model_plan.json``). A report says how much of a cut run is
missing, and a ``--resume`` given other options is refused before it drops what the first run had not
finished.

Public API: :func:`save_planned`, :func:`load_planned`, :func:`load_plan`, :func:`changed_settings`,
:func:`dropped_unfinished`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, TypeVar

from fusedce_profiler.instrument import store

T = TypeVar("T")


def save_planned(folder: str | Path, name: str, key: str, items: list, settings: dict | None = None) -> Path:
    """Store ``items`` (dataclasses) as ``{key: [...]}`` in ``folder/name``, with ``settings`` (what
    every item is measured with, e.g. a grid's warm-up and repeats) under ``"settings"``."""
    return store.write_json(Path(folder) / name, {key: [asdict(item) for item in items],
                                                  **({"settings": settings} if settings else {})})


def changed_settings(stored: dict | None, settings: dict) -> list[str]:
    """``"name A, now B"`` for each of ``settings`` whose stored value differs (none when nothing was stored)."""
    return [f"{name} {stored[name]!r}, now {value!r}" for name, value in settings.items()
            if stored is not None and name in stored and stored[name] != value]


def load_planned(folder: str | Path, name: str, key: str, parse: Callable[[dict], T], most: int) -> list[T] | None:
    """The items of ``folder/name`` (:func:`load_plan`), without its settings."""
    plan = load_plan(folder, name, key, parse, most)
    return None if plan is None else plan[0]


def load_plan(folder: str | Path, name: str, key: str, parse: Callable[[dict], T],
              most: int) -> tuple[list[T], dict | None] | None:
    """``(items, settings)`` of ``folder/name``, read once: each item read by ``parse``, and the
    ``"settings"`` stored with them (:func:`save_planned`; ``None`` when it holds none, a plan stored
    before they were). ``None`` when there is no such file; ``ValueError`` naming the file when it
    cannot be read as a plan of ``key``, or holds more than ``most`` items (more than a run may plan)."""
    path = Path(folder) / name
    if not store.present(path):
        return None
    raw = store.read_json(path)
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get(key), list):
            raise ValueError(f"expected an object with a list of {key}")
        if len(raw[key]) > most:
            raise ValueError(f"{len(raw[key]):,} {key}, more than the {most:,} a run plans")
        items = [parse(item) for item in raw[key]]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a plan of {key} ({exc})") from None
    settings = raw.get("settings")
    return items, settings if isinstance(settings, dict) else None


def dropped_unfinished(stored: list | None, items: list, finished: set[str]) -> list:
    """The ``stored`` plan's items (each with a ``key()``) that are neither among the new plan's
    ``items`` nor among the ``finished`` keys: what a resume with this plan would leave unmeasured.
    A plan that adds items, or leaves out finished ones, drops nothing; no stored plan drops nothing."""
    keys = {item.key() for item in items}
    return [item for item in stored or [] if item.key() not in keys and item.key() not in finished]
