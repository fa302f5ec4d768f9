"""Whether a step's peak beyond its modelled bytes is the caching allocator's whole blocks, and
what :data:`fusedce.planner.ALLOCATOR_SLACK_BYTES` does to ``"min"`` (on the GPU).

The frontier measured ``"min"`` at Qwen2.5 amp at 1.05005 × floor, 0.8 MiB above the memory
model's prediction; elsewhere the measured peaks sit 0.1 MiB below it. The CUDA caching
allocator hands out a cached block whole when splitting it would leave less than 1 MiB, and
``torch.cuda.max_memory_allocated`` counts the whole block; its ``requested_bytes`` statistic
counts what the tensors asked for. Prediction, if that is the cause: requested − predicted ≈
−0.1 MiB on every cell, allocated − requested between 0 and 1 MiB per such block.

For each slack (0, then the planner's), the frontier's cells of each case in the frontier's
order (:func:`benchmarks.frontier.run_frontier`, so the cache holds what it held there), then
per budget one more step with both statistics read around it.

    python3 benchmarks/allocator_slack_ab.py --out $OUT/allocator-slack     (on the device)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import frontier  # noqa: E402
from benchmarks.protocol import MODES, floor_bytes, make_inputs  # noqa: E402
from benchmarks.host_profile import step_fn  # noqa: E402
from fusedce import planner  # noqa: E402
from fusedce.memory_model import predict_peak_bytes  # noqa: E402

CASES = (("Qwen2.5-7B", "amp"), ("Gemma-2-2B", "bf16"), ("Llama-3-8B, 32k tokens", "amp"))
IMPLS = ("fusedce", "torch_compile", "fusedce_fast", "fusedce_min")
BUDGETS = (None, "min", "fast")


def both_peaks(case: frontier.Case, budget) -> dict:
    """One step's peak extra as allocated and as requested, and the model's prediction (bytes)."""
    row, mode = case.row, MODES[case.mode]
    inputs = make_inputs(row, mode, device="cuda", bias=case.bias)
    step = step_fn(inputs.hidden, inputs.weight, inputs.target, case.mode, budget or "default")
    step()
    inputs.hidden.grad = inputs.weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    allocated0 = torch.cuda.memory_allocated()
    requested0 = torch.cuda.memory_stats()["requested_bytes.all.current"]
    step()
    torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated() - allocated0
    requested = torch.cuda.memory_stats()["requested_bytes.all.peak"] - requested0
    weight_dtype = inputs.weight.dtype
    predicted = predict_peak_bytes(row.tokens, row.hidden, row.vocab, hidden_dtype=inputs.hidden.dtype,
                                   weight_dtype=weight_dtype, compute_dtype=torch.bfloat16,
                                   memory_budget=budget).step
    floor = floor_bytes(row, mode, bias=case.bias)
    del inputs
    torch.cuda.empty_cache()
    return {"case": case.label, "mode": case.mode, "budget": budget or "default", "floor": floor,
            "allocated": allocated, "requested": requested, "predicted": predicted,
            "x_floor_allocated": allocated / floor, "x_floor_requested": requested / floor,
            "allocated_minus_requested_kib": (allocated - requested) / 1024,
            "requested_minus_predicted_kib": (requested - predicted) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cases = tuple(c for c in frontier.CASES if (c.label, c.mode) in CASES)
    slack = planner.ALLOCATOR_SLACK_BYTES
    lines = []
    for label, value in (("slack-0", 0), (f"slack-{slack}", slack)):
        planner.ALLOCATOR_SLACK_BYTES = value
        frontier.run_frontier(args.out / label, device="cuda", cases=cases, impls=IMPLS, repeats=5, budget_s=400,
                              log=lambda line: print(line, flush=True))
        for case in cases:
            for budget in BUDGETS:
                row = {"slack": value, **both_peaks(case, budget)}
                lines.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "peaks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
