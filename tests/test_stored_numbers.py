"""A stored row's numbers from a stranger's folder: a byte count or time that no measurement
can give (negative, wider than 64 bits) makes the row invalid — skipped and named by line in
the report — instead of a traceback (a 401-digit integer overflowed the conversion to float)
or a report that shows "-5 B" and counts the row in its findings."""
from __future__ import annotations

import json

import pytest

from fusedce_profiler.instrument.records import CellResult
from fusedce_profiler.instrument.store import RESULTS_FILE
from fusedce_profile.report import build_report

pytestmark = pytest.mark.faults


def _row(**fields) -> dict:
    return {"spec": {"backend": "torch", "tokens": 16, "hidden": 32, "vocab": 256}, "status": "ok",
            "peak_step_bytes": 4096, "time_ms": 1.5, **fields}


@pytest.mark.parametrize("field, value, said", [("peak_step_bytes", 10 ** 400, "must fit in 64 bits"),
                                                ("peak_step_bytes", -5, "must be at least 0"),
                                                ("floor_bytes", 2 ** 63, "must fit in 64 bits"),
                                                ("time_ms", -1.0, "must be a time from 0 to")])
def test_an_impossible_number_makes_the_row_invalid(field, value, said):
    assert CellResult.from_dict(_row()).peak_step_bytes == 4096
    with pytest.raises(ValueError, match=f"{field} {said}"):
        CellResult.from_dict(_row(**{field: value}))


def test_report_skips_the_row_and_names_its_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    rows = [_row(), {**_row(peak_step_bytes=10 ** 400), "spec": {**_row()["spec"], "tokens": 17}}]
    (out / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    cells = build_report(str(out))
    assert [c.spec.tokens for c in cells] == [16]
    assert "an integer of 401 digits, more than the 40 any stored value has" in (out / "summary.md").read_text()
