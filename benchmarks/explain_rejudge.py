"""Judge readings again from the steps a GPU run of ``explain`` stored, on any machine.

``explain_steps.jsonl`` holds every measured step of an explanation (calibrations, the repeated
step, confirmations). This script rebuilds the explanation with the current judging code from
those steps alone — nothing is measured; a step the stored file lacks (a confirmation of a
hypothesis the old run did not confirm) is left out, so confirmations are off — and writes the
folder as ``explain`` does (``explain.json``, ``summary.md``).

``python benchmarks/explain_rejudge.py STEPS --naive 22785 --fused 22155 --card 24 --out DIR
[--tied/--untied] [--calibration-batches 2,4]``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from fusedce_profile.explain import step_key
    from fusedce_profile.explain_run import ExplainRun
    from fusedce_profiler.instrument.models.configs import get_preset
    from fusedce_profiler.instrument.models.source import BuiltinSource
    from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
    from fusedce_profiler.judgements.explain.calibration import enumerate_families
    from fusedce_profiler.judgements.explain.records import Observation

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=Path)
    parser.add_argument("--naive", type=float, required=True)
    parser.add_argument("--fused", type=float, required=True)
    parser.add_argument("--card", type=float, required=True)
    parser.add_argument("--preset", default="user-gpt")
    parser.add_argument("--tied", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--seq-candidates", default="512,1024,2048")
    parser.add_argument("--calibration-batches", default="2,4")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    stored = {}
    for line in args.steps.read_text().splitlines():
        row = json.loads(line)
        stored[row["key"]] = ModelResult.from_dict(row["result"])

    def run_job(job, purpose):
        key = step_key(job) + ("-repeat" if purpose == "repeat" else "")
        if key in stored:
            return stored[key]
        return ModelResult(job=job, status="not-run", message="not in the stored steps")

    source = BuiltinSource(get_preset(args.preset))
    obs = Observation(args.naive, args.fused, args.card, tied=args.tied)
    seqs = tuple(int(s) for s in args.seq_candidates.split(","))
    ties = (args.tied,) if args.tied is not None else (False, True)
    families = enumerate_families(obs, attention_impls=("eager", "sdpa"), tie_choices=ties, seq_candidates=seqs)
    base = ModelJob(source.config, "torch", 1, seqs[0], device="cuda", trace=False)
    batches = tuple(int(b) for b in args.calibration_batches.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    run = ExplainRun(obs, source, base, families, batches, args.out, on_gpu=True, confirm=0, stand_in=True,
                     progress=lambda line: None)
    e = run.execute(run_job)
    print(json.dumps({"out": str(args.out), "decided": e.decided, "consistent": len(e.consistent),
                      "consistent_families": e.consistent_families, "hypotheses": len(e.hypotheses),
                      "best": e.consistent[0].label() if e.consistent else None}))


if __name__ == "__main__":
    main()
