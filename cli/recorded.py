"""``fusedce-profile report DIR`` for a folder of steps recorded in the user's own run
(:mod:`fusedce_profile`): rebuild ``summary.md`` and the plots; exit 0."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from fusedce_cli import exit_codes
from fusedce_cli.usage import usage_errors


def recorded_report(run_dir: Path, console, as_json: bool) -> int:
    from fusedce_profiler.instrument.recording.records import load_recorded_steps
    from fusedce_reports.recorded_report import write_recorded_report

    with usage_errors():
        loaded = load_recorded_steps(run_dir)
        summary = write_recorded_report(run_dir)
    for problem in loaded.problems:
        console.print(f"incomplete run: {problem}", markup=False)
    console.print(f"report: {summary} ({len(loaded.records)} recorded step(s))", markup=False)
    if as_json:
        plots = sorted(str(p) for p in (run_dir / "plots").glob("*.png"))
        sys.stdout.write(json.dumps({"summary": str(summary), "plots": plots, "steps": len(loaded.records),
                                     "incomplete": loaded.problems, "exit_code": exit_codes.OK}, indent=2) + "\n")
    return exit_codes.OK
