"""Which kind of run a folder holds, told by the records only that kind writes.

A run folder holds one run: a command continuing a run (``--resume``) or a recorder writing into
a folder refuses one that holds another kind's records, which it would otherwise write beside
(and whose report it would replace).

Public API: :data:`KIND_RECORDS`, :func:`other_kind`, :func:`a_kind`.
"""
from __future__ import annotations

import os
from pathlib import Path

from fusedce_profiler.instrument import store

KIND_RECORDS = {"grid": (store.RESULTS_FILE, store.PLAN_FILE), "model": (store.MODEL_RESULTS_FILE, store.FIT_FILE, store.MODEL_PLAN_FILE),
                "parity": (store.PARITY_FILE,), "doctor": (store.DOCTOR_FILE,),
                "explain": (store.EXPLAIN_FILE, store.EXPLAIN_STEPS_FILE), "recorded": (store.RECORDED_STEPS_FILE,)}
"""Each kind of run by the records only it writes (``environment.json`` and the interruption mark
are every kind's)."""


def other_kind(folder: Path, kind: str) -> tuple[str, str] | None:
    """``(kind, record)`` of a run of another kind than ``kind`` whose record ``folder`` holds."""
    for other, records in KIND_RECORDS.items():
        for record in records:
            if other != kind and os.path.lexists(folder / record):
                return other, record
    return None


def a_kind(kind: str) -> str:
    """``"a grid"``, ``"an explain"``: the kind with its article."""
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
