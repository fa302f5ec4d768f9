"""The device's doctor suite (benchmarks/device/doctor_suite.py) runs on the CPU at the tests' sizes:
raw rows and a table, every planted mistake failing its check and every correct wiring passing."""
from __future__ import annotations

import importlib.util
import json

from tests.processes import REPO

_SPEC = importlib.util.spec_from_file_location("doctor_suite", REPO / "benchmarks" / "device" / "doctor_suite.py")
suite = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(suite)


def test_the_suite_writes_raw_rows_and_a_table_and_every_run_is_right(tmp_path):
    code = suite.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--cases", "shift,fresh,accumulation"])
    rows = json.loads((tmp_path / "results.json").read_text())
    assert code == 0, [r for r in rows if not r.get("right")]
    # 4 cases × 2 modes × (planted, control)
    assert len(rows) == 16 and all(r["right"] for r in rows)
    assert {r["mode"] for r in rows} == {"amp-bf16", "fp32"} and {r["role"] for r in rows} == {"planted", "control"}
    table = (tmp_path / "table.md").read_text()
    assert "16 of 16 runs right on cpu" in table
