"""Judge readings again from the steps a GPU run of ``explain`` stored, on any machine.

``explain_steps.jsonl`` holds every measured step of an explanation (calibrations, the repeated
step, confirmations). This script rebuilds the explanation with the current judging code from
those steps alone — nothing is measured; a step the stored file lacks (a confirmation of a
hypothesis the old run did not confirm) is left out, so confirmations are off — and writes the
folder as ``explain`` does (``explain.json``, ``summary.md``).

One explanation: ``python benchmarks/explain_rejudge.py STEPS --naive 22785 --fused 22155 --card 24
--out DIR [--tied/--untied] [--calibration-batches 2,4]`` (without ``--calibration-batches``: the GPU
default, 8192 and 16384 tokens per family).

The whole blind benchmark: ``python benchmarks/explain_rejudge.py --blind RUN/blind --out DIR``
re-judges every case of ``RUN/blind/truth.jsonl`` from its stored steps (``cases/<name>/``) and
writes ``DIR/results.jsonl`` and ``DIR/summary.md`` as :mod:`explain_blind` does, with the design
and the held-out half of the cases reported separately; ``--seq-stated`` judges each case as if its
user had stated T.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def rejudge(steps: Path, obs, out: Path, *, preset: str = "user-gpt", seqs=(512, 1024, 2048),
            batches: tuple[int, ...] | None = None):
    """The explanation of ``obs`` rebuilt from the steps stored in ``steps`` (written to ``out``)."""
    from fusedce_profile.explain import step_key
    from fusedce_profile.explain_run import ExplainRun
    from fusedce_profiler.instrument.models.configs import get_preset
    from fusedce_profiler.instrument.models.source import BuiltinSource
    from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
    from fusedce_profiler.judgements.explain.calibration import enumerate_families

    stored = {}
    for line in steps.read_text().splitlines():
        row = json.loads(line)
        stored[row["key"]] = ModelResult.from_dict(row["result"])

    def run_job(job, purpose):
        key = step_key(job) + ("-repeat" if purpose == "repeat" else "")
        if key in stored:
            return stored[key]
        return ModelResult(job=job, status="not-run", message="not in the stored steps")

    source = BuiltinSource(get_preset(preset))
    ties = (obs.tied,) if obs.tied is not None else (False, True)
    families = enumerate_families(obs, attention_impls=("eager", "sdpa"), tie_choices=ties, seq_candidates=seqs)
    base = ModelJob(source.config, "torch", 1, seqs[0], device="cuda", trace=False)
    out.mkdir(parents=True, exist_ok=True)
    run = ExplainRun(obs, source, base, families, batches, out, on_gpu=True, confirm=0, stand_in=True,
                     progress=lambda line: None)
    return run.execute(run_job)


def rejudge_blind(blind: Path, out: Path, seq_stated: bool = False) -> None:
    """Every case of a stored blind run, judged again; results and summary as the benchmark writes them.
    ``seq_stated``: each case judged as if its user had stated T (``--seq``)."""
    from explain_blind import CARD_GIB, DESIGN_HALF, Case, judge, summarise_halves

    from fusedce_profiler.judgements.explain.records import MIB, Observation

    out.mkdir(parents=True, exist_ok=True)
    results = []
    for line in (blind / "truth.jsonl").read_text().splitlines():
        t = json.loads(line)
        case = Case(**t["case"])
        if t["naive"]["status"] != "ok" or t["fused"]["status"] != "ok":
            results.append({"case": case.name, "skipped": "the ground truth did not fit the card"})
            continue
        naive, fused = t["naive"]["reading"] / MIB, t["fused"]["reading"] / MIB
        obs = Observation(naive, fused, CARD_GIB, tied=False, fused_larger=fused > naive)
        start = time.perf_counter()
        e = rejudge(blind / "cases" / case.name / "explain_steps.jsonl", obs, out / "cases" / case.name,
                    **({"seqs": (case.seq,)} if seq_stated else {}))
        row = {"case": case.name, "truth": asdict(case), "naive_mib": naive, "fused_mib": fused, "confirm": 0,
               "half": "design" if case.name in DESIGN_HALF else "held-out"}
        row.update(judge(case, e))
        row["seconds"] = time.perf_counter() - start
        results.append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "half", "truth_consistent", "consistent_families")}),
              flush=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    (out / "summary.md").write_text(summarise_halves(results))
    print((out / "summary.md").read_text())


def main() -> None:
    from fusedce_profiler.judgements.explain.records import Observation

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=Path, nargs="?")
    parser.add_argument("--blind", type=Path, help="a stored blind run's folder (truth.jsonl, cases/)")
    parser.add_argument("--seq-stated", action="store_true", help="with --blind: judge each case with its T stated")
    parser.add_argument("--naive", type=float)
    parser.add_argument("--fused", type=float)
    parser.add_argument("--card", type=float)
    parser.add_argument("--preset", default="user-gpt")
    parser.add_argument("--tied", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--seq-candidates", default="512,1024,2048")
    parser.add_argument("--calibration-batches", default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.blind is not None:
        return rejudge_blind(args.blind, args.out, args.seq_stated)
    if args.steps is None or None in (args.naive, args.fused, args.card):
        parser.error("STEPS, --naive, --fused and --card are needed without --blind")
    obs = Observation(args.naive, args.fused, args.card, tied=args.tied)
    batches = tuple(int(b) for b in args.calibration_batches.split(",")) if args.calibration_batches else None
    e = rejudge(args.steps, obs, args.out, preset=args.preset,
                seqs=tuple(int(s) for s in args.seq_candidates.split(",")), batches=batches)
    print(json.dumps({"out": str(args.out), "decided": e.decided, "consistent": len(e.consistent),
                      "consistent_families": e.consistent_families, "hypotheses": len(e.hypotheses),
                      "best": e.consistent[0].label() if e.consistent else None}))


if __name__ == "__main__":
    main()
