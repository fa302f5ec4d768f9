"""fusedce's analytic memory model against the peaks measured on an H200.

The committed side-by-side results (``benchmarks/results/nvidia-h200-2026-12-02-aligned.json``)
hold fusedce's measured peak extra for the ANCHORS rows; the model
(:func:`fusedce.memory_model.predict_peak_bytes`) must reproduce each within the profiler's
band (±5% or ±64 MiB). A change to the chunk planner or the chunked loop that moves the
peak fails here until the GPU figures are measured again.

Two rows of that file ran a plan the planner no longer makes, each predicted with that plan forced:
32768×4096×128256 in amp, before row chunks were balanced (the balanced plans are checked against
the A/B that measured both plans side by side on an H100,
``benchmarks/results/balanced-rows-h100-2026-12-05/``), and the same head in bf16, before its
backward was split in two passes (fusedce/split_plan.py: one pass of all 32768 rows then, in blocks of
the 1024 columns a block was held to then, fusedce.block_sizes.narrowest_cols).
"""
import json
from pathlib import Path

import pytest
import torch

from fusedce.memory_model import predict_peak_bytes
from fusedce.planner import gradient_floor_bytes

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "nvidia-h200-2026-12-02-aligned.json"
BALANCED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "balanced-rows-h100-2026-12-05"
MiB = 1 << 20
#: (tokens, hidden, vocab, mode) → (rows, cols) of a row measured with a plan the planner has since changed.
PLAN_MEASURED = {(32768, 4096, 128256, "amp-bf16"): (13685, 1664), (32768, 4096, 128256, "bf16"): (32768, 1024)}


def _fusedce_cells():
    raw = json.loads(RESULTS.read_text())
    return [c for c in raw["cells"] if c["spec"]["backend"] == "fusedce" and c["status"] == "ok"]


@pytest.mark.parametrize("cell", _fusedce_cells(), ids=lambda c: f"{c['spec']['tokens']}x{c['spec']['hidden']}x"
                         f"{c['spec']['vocab']}-{c['spec']['mode']}")
def test_model_reproduces_the_measured_h200_peak(cell):
    spec = cell["spec"]
    weight_dtype = torch.float32 if spec["mode"].startswith("amp") else torch.bfloat16
    rows, cols = PLAN_MEASURED.get((spec["tokens"], spec["hidden"], spec["vocab"], spec["mode"]), (None, None))
    predicted = predict_peak_bytes(spec["tokens"], spec["hidden"], spec["vocab"], hidden_dtype=torch.bfloat16,
                                   weight_dtype=weight_dtype, compute_dtype=torch.bfloat16, chunk_size=rows,
                                   vocab_chunk_size=cols).step
    measured = cell["peak_step_bytes"]
    assert abs(predicted - measured) <= max(0.05 * measured, 64 * MiB), (predicted, measured)
    assert abs(predicted - measured) <= 1 * MiB, "the model was exact to 1 MiB on every row of this file"


def _balanced_cells():
    cells = []
    for path in sorted(BALANCED.glob("balanced-rows-ab-*.json")):
        for row in json.loads(path.read_text())["results"]:
            for variant in ("balanced", "previous"):
                cells.append((row["hidden_dtype"], row["head"], variant, row))
    return cells


@pytest.mark.parametrize("hidden_name,head,variant,row", _balanced_cells(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_model_reproduces_both_plans_of_the_balanced_rows_ab(hidden_name, head, variant, row):
    """Each plan's measured peak above the inputs and gradients (autocast, fp32 weight), within
    1 MiB: the balanced plan as the planner makes it now, the previous one through
    ``chunk_size`` / ``vocab_chunk_size``."""
    n, h, v = (int(x) for x in head.split("x"))
    hidden_dtype = getattr(torch, hidden_name)
    forced = {} if variant == "balanced" else dict(chunk_size=row["previous_plan"][0],
                                                   vocab_chunk_size=row["previous_plan"][1])
    prediction = predict_peak_bytes(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=torch.float32,
                                    compute_dtype=torch.bfloat16, sm_count=132, **forced)
    if variant == "balanced":
        assert [prediction.plan.rows, prediction.plan.cols] == row["plan"], "the planner's plan is the one measured"
    floor = gradient_floor_bytes(n, h, v, hidden_dtype, torch.float32)
    assert abs(prediction.step - floor - row[f"{variant}_peak_extra_bytes"]) <= 1 * MiB
