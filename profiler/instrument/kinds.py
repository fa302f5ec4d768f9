"""Which kind of run a folder holds, told by the records only that kind writes.

A run folder holds one run: a command continuing a run (``--resume``) or a recorder writing into
a folder refuses one that holds another kind's records, which it would otherwise write beside
(and whose report it would replace).

A folder nested in a run's folder is refused too (by every command's ``--out`` and by the
recorder): the outer run's ``--force`` would remove it.

Public API: :data:`KIND_RECORDS`, :data:`RUN_RECORDS`, :data:`RESULT_RECORDS`, :data:`MEASURED_RECORDS`,
:func:`other_kind`, :func:`enclosing_run`, :func:`a_kind`.
"""
from __future__ import annotations

import os
from pathlib import Path

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.interruption import INTERRUPTED_FILE
from fusedce_profiler.instrument.runlock import live_holder

KIND_RECORDS = {"grid": (store.RESULTS_FILE, store.PLAN_FILE), "model": (store.MODEL_RESULTS_FILE, store.FIT_FILE, store.MODEL_PLAN_FILE),
                "parity": (store.PARITY_FILE,), "doctor": (store.DOCTOR_FILE,),
                "explain": (store.EXPLAIN_FILE, store.EXPLAIN_STEPS_FILE), "recorded": (store.RECORDED_STEPS_FILE,)}
"""Each kind of run by the records only it writes (``environment.json`` and the interruption mark
are every kind's)."""


RUN_RECORDS = tuple(record for records in KIND_RECORDS.values() for record in records) + (store.ENVIRONMENT_FILE,
                                                                                        INTERRUPTED_FILE)
"""The files that make a folder a run's, of any kind: one of them is written as soon as a run starts."""


def other_kind(folder: Path, kind: str) -> tuple[str, str] | None:
    """``(kind, record)`` of a run of another kind than ``kind`` whose record ``folder`` holds."""
    for other, records in KIND_RECORDS.items():
        for record in records:
            if other != kind and os.path.lexists(folder / record):
                return other, record
    return None


RESULT_RECORDS = (store.RESULTS_FILE, store.MODEL_RESULTS_FILE, store.PARITY_FILE, store.DOCTOR_FILE,
                  store.EXPLAIN_FILE, store.RECORDED_STEPS_FILE)
"""The records ``report`` reads, one per kind of run: a folder holding one is a run's folder."""

MEASURED_RECORDS = RESULT_RECORDS + (store.EXPLAIN_STEPS_FILE, store.FIT_FILE)
"""Every record that holds finished measurements, those a run cut before its result record keeps
included (an explain's steps, kept for ``--resume`` by a run killed before it stored its
explanation): a folder holding one is a run's, and a ``--force`` around it would lose them."""


def enclosing_run(folder: Path) -> tuple[Path, str] | None:
    """``(outer, what)`` of the nearest folder above ``folder`` (its links resolved) that is a run's:
    it holds one of :data:`MEASURED_RECORDS`, or a live run holds its lock (one that has stored no
    result yet). A run or recording inside it would be removed by its ``--force``. A project folder
    that only happens to hold a file of another record's name (a ``plan.json``, an
    ``environment.json``) is none."""
    for outer in Path(os.path.realpath(folder)).parents:
        for record in MEASURED_RECORDS:
            if os.path.lexists(outer / record):
                return outer, record
        holder = live_holder(outer) if os.path.lexists(outer / store.LOCK_FILE) else None
        if holder is not None:
            return outer, f"the lock of a live run, {holder}"
    return None


def a_kind(kind: str) -> str:
    """``"a grid"``, ``"an explain"``: the kind with its article."""
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
