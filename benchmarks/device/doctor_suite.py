"""The doctor's planted-bug suite on a device: every check's planted mistake and the correct wiring
it is told apart from, in bf16 autocast and in fp32, with the verdicts, the measured tolerances and
the time each run took.

    python3 benchmarks/device/doctor_suite.py --out DIR [--device cuda|cpu] [--tiny] [--budget S]

Writes ``DIR/results.json`` (one row per run: case, check, wrapper, model, mode, role, verdict of
the check, every failed check, its evidence, the tolerances, seconds) and ``DIR/table.md``; prints
the table. A row is *right* when the planted mistake fails its check and the correct wiring passes
it (and passes overall). ``--tiny``: the tests' sizes (V=96, H=32, 4×32 tokens), for a CPU dry run;
otherwise V=8192, H=512, 8×256 tokens. Runs past ``--budget`` seconds are recorded as skipped.
The wrappers and models are the tests' (tests/doctor_wrappers.py, tests/doctor_models.py); user
code runs in this process (it is ours), so nothing here measures the sandbox.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: (check, planted mistake, correct wiring, model factory): the wiring mistakes of tests/test_model_doctor.py,
#: then the training situations of tests/doctor_wrappers.py, compile last (the slowest).
WIRING_CASES = [
    ("body", "detached_hidden", "correct", "untied"),
    ("weight", "detached_weight", "correct", "tied"),
    ("shift", "not_shifted", "correct", "untied"),
    ("ignore", "padding_trained", "correct", "untied_bias"),
    ("reduction", "summed", "correct", "untied"),
    ("norm", "norm_skipped", "correct", "untied"),
    ("bias", "bias_dropped", "correct", "untied_bias"),
    ("gradient", "gradient_doubled", "correct", "tied_bias"),
    ("compile", "compile_mishandles_ignored", "correct", "untied"),
]
MODES = ("amp-bf16", "fp32")


def _wrapper(name: str):
    import tests.doctor_wrappers as wrappers
    import tests.test_model_doctor as planted

    return getattr(wrappers, name, None) or getattr(planted, name)


def _one(check: str, wrapper: str, model: str, mode: str, device: str, batch: int, seq: int) -> dict:
    import tests.doctor_wrappers as wrappers
    from fusedce_profiler.instrument.models.source import UserSource
    from fusedce_profiler.judgements.doctor.doctor import run_doctor
    import tests.test_model_doctor as planted

    wrappers._copies.clear()
    planted._stale.clear()
    source = UserSource(f"tests.doctor_models:{model}")
    started = time.perf_counter()
    run = run_doctor(_wrapper(wrapper), source.build(device), source=source, device=device, mode=mode,
                     batch=batch, seq=seq, compile_backend=("inductor" if device.startswith("cuda") else "eager")
                     if check == "compile" else None)
    seconds = time.perf_counter() - started
    verdicts = {c.key: c.verdict for c in run.checks}
    return {"verdict": verdicts[check], "failed": sorted(k for k, v in verdicts.items() if v == "fail"),
            "passed": run.passed, "evidence": next(c.evidence for c in run.checks if c.key == check),
            "tolerance": run.tolerance, "spread": run.spread, "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("--tiny", action="store_true", help="the tests' sizes (a CPU dry run)")
    parser.add_argument("--budget", type=float, default=140.0, help="seconds; later runs are skipped")
    parser.add_argument("--cases", default="", help="comma-separated checks to run (default: all)")
    args = parser.parse_args(argv)

    import torch

    import tests.doctor_models as models

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch, seq = (4, 32) if args.tiny else (8, 256)
    if not args.tiny:
        models.set_size(vocab=8192, hidden=512)
    wanted = set(filter(None, args.cases.split(",")))
    has_torch_lce = hasattr(torch.nn.functional, "linear_cross_entropy")
    rows, begun = [], time.perf_counter()
    from tests.doctor_wrappers import TRAINING_CASES

    cases = WIRING_CASES[:-1] + TRAINING_CASES + WIRING_CASES[-1:]
    for check, planted, control, model in cases:
        if wanted and check not in wanted:
            continue
        for mode in MODES:
            for role, wrapper in (("planted", planted), ("control", control)):
                row = {"check": check, "wrapper": wrapper, "model": model, "mode": mode, "role": role,
                       "device": device, "torch": torch.__version__}
                if wrapper == "torch_lce_without_options" and not has_torch_lce:
                    row.update(verdict="skipped", note=f"torch {torch.__version__} has no linear_cross_entropy")
                elif time.perf_counter() - begun > args.budget:
                    row.update(verdict="skipped", note=f"past the {args.budget:g} s budget")
                else:
                    try:
                        row.update(_one(check, wrapper, model, mode, device, batch, seq))
                    except Exception as exc:  # noqa: BLE001 - a row that failed is a result too
                        row.update(verdict="error", note=f"{type(exc).__name__}: {exc}"[:400])
                if row["verdict"] not in ("skipped", "error"):
                    row["right"] = (row["verdict"] == "fail") if role == "planted" else \
                        (row["verdict"] == "pass" and row["passed"])
                rows.append(row)
                print(f"{check:12} {mode:8} {role:7} {wrapper:28} {row['verdict']:8} {row.get('seconds', '')}",
                      flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    judged = [r for r in rows if "right" in r]
    lines = ["| check | mode | role | wrapper | model | verdict | right | s | tolerance |", "|---" * 9 + "|"]
    lines += [f"| {r['check']} | {r['mode']} | {r['role']} | {r['wrapper']} | {r['model']} | {r['verdict']} | "
              f"{r.get('right', '–')} | {r.get('seconds', '–')} | {r.get('tolerance', 0):.2g} |" for r in rows]
    lines += ["", f"{sum(r['right'] for r in judged)} of {len(judged)} runs right on {device} "
              f"(torch {torch.__version__}); {len(rows) - len(judged)} skipped or errored; "
              f"{time.perf_counter() - begun:.0f} s in all."]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))
    return 0 if all(r["right"] for r in judged) else 1


if __name__ == "__main__":
    sys.exit(main())
