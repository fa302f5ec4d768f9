"""Run ``doctor`` (the public Python API, one worker per run) on every blind case in both modes.

    python -m tests.blind_doctor.run_table OUT.json [--jobs 2] [--only SUBSTRING]
    python -m tests.blind_doctor.run_table --markdown BEFORE.json AFTER.json   # the before/after table

Writes one row per (case, mode): truth, exit code, failed items, and whether doctor was right
(correct → exit 0; bug → exit 1 with one of the expected items failed).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from tests.blind_doctor.cases import BOTH, CASES, Case


def judge(case: Case, mode: str) -> dict:
    """One doctor run → its table row."""
    from fusedce_profile.doctor import UserCodeFailed, doctor
    from fusedce_profile.errors import UsageError

    started = time.perf_counter()
    failed, unclear, message = [], [], ""
    try:
        run = doctor(case.loss_spec, model=case.model_spec, device="cpu", mode=mode,
                     out=tempfile.mkdtemp(prefix="doctor-blind-") + "/run")
        failed = [c.key for c in run.checks if c.verdict == "fail"]
        unclear = [c.key for c in run.checks if c.verdict == "unclear"]
        code = 0 if run.passed else 1
        message = "; ".join(f"{c.key}: {getattr(c, 'detail', '')}" for c in run.checks if c.verdict == "fail")[:600]
    except UsageError as exc:
        code, message = 2, str(exc)
    except UserCodeFailed as exc:
        code, message = 1, str(exc)
    right = case.judged_right(code, failed)
    return {"case": case.name, "mode": mode, "truth": case.truth, "exit": code, "failed": failed,
            "unclear": unclear, "right": right, "message": message,
            "seconds": round(time.perf_counter() - started, 1)}


def _answer(row: dict) -> str:
    failed = ", ".join(row["failed"]) or "—"
    return f"exit {row['exit']}, failed {failed} {'✓' if row['right'] else '✗'}"


def markdown(before: list[dict], after: list[dict]) -> str:
    """One line per (case, mode): truth, doctor's answer before and after, right (✓) or wrong (✗)."""
    earlier = {(r["case"], r["mode"]): r for r in before}
    lines = ["| case (model/wrapper) | mode | truth | before | after |", "| --- | --- | --- | --- | --- |"]
    for r in after:
        old = earlier.get((r["case"], r["mode"]))
        lines.append(f"| {r['case']} | {r['mode']} | {r['truth']} | {_answer(old) if old else '—'} | {_answer(r)} |")
    lines.append("")
    lines.append(f"Right: {sum(r['right'] for r in before)} of {len(before)} before, "
                 f"{sum(r['right'] for r in after)} of {len(after)} after.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?")
    parser.add_argument("--markdown", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    if args.markdown:
        before, after = (json.load(open(path)) for path in args.markdown)
        print(markdown(before, after))
        return
    todo = [(c, m) for c in CASES for m in BOTH if m in c.modes and args.only in c.name]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(judge, *zip(*todo)))
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    for r in rows:
        print(f"{'ok ' if r['right'] else 'BAD'} {r['case']:<45} {r['mode']:<9} {r['truth']:<28} exit {r['exit']} "
              f"failed={','.join(r['failed'])} unclear={','.join(r['unclear'])}")
    print(f"{sum(r['right'] for r in rows)} of {len(rows)} right")


if __name__ == "__main__":
    main()
