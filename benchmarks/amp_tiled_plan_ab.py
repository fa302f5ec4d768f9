"""The tiled plan under autocast against the plan it replaced, in one process (an A/B of one change).

With an fp32 weight under autocast the backward's blocks now go through the tiled kernels on the
converted weight chunks, and the planner sizes such a block at 2 bytes a logit (twice the columns in
the same bytes). ``previous`` restores the rule before (tiled plans only for a weight already in the
compute dtype; the backward on the block kernels) by patching ``fusedce.kernels.tiles._layout_planned``
and ``fusedce.passes._backward_tile_math``; ``default`` is the code as it is. Per amp head (fp32 weight,
bf16 hidden, bf16 autocast, default budget): median of ``--repeats`` CUDA-event timings, the peak
allocated above the inputs, the difference of loss and gradients, and torch.compile for the ratio.

    python3 benchmarks/amp_tiled_plan_ab.py --out $OUT        (on the device; writes amp-tiled-plan-ab.json)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import passes  # noqa: E402
from fusedce.kernels import tiles  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from fusedce_profiler.instrument.backends import get_backend  # noqa: E402
from benchmarks.tiles_ab import measure, rel, save_with_environment  # noqa: E402

HEADS = ("8192x768x32777", "8192x3072x32064", "8192x4096x128256", "8192x2304x256000", "16384x3584x152064")


@contextlib.contextmanager
def previous_rule(on: bool):
    """Tiled plans and backward blocks only for a weight already in the compute dtype."""
    layout, backward = tiles._layout_planned, passes._backward_tile_math
    if on:
        tiles._layout_planned = lambda h, w, dtype: w.dtype == dtype and layout(h, w, dtype)
        passes._backward_tile_math = lambda block_math: None
    try:
        yield
    finally:
        tiles._layout_planned, passes._backward_tile_math = layout, backward


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for head in HEADS:
        n, h, v = (int(x) for x in head.split("x"))
        torch._dynamo.reset()
        gen = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(n, h, device="cuda", generator=gen).bfloat16().requires_grad_()
        weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).requires_grad_()
        target = torch.randint(0, v, (n,), device="cuda", generator=gen)
        compiled = get_backend("torch-compile").make()
        row, results = {"head": head}, {}
        for name in ("default", "previous", "torch_compile"):
            def step(name=name):
                hidden.grad = weight.grad = None
                with previous_rule(name == "previous"):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = (compiled(hidden, weight, target, None, LossOptions()) if name == "torch_compile"
                                else fusedce.linear_cross_entropy(hidden, weight, target))
                    loss.backward()
                return loss.detach().float(), hidden.grad, weight.grad

            result, peak, times = measure(step, hidden, weight, args.repeats)
            results[name] = tuple(t.clone() for t in result)
            row[f"{name}_peak_extra_bytes"] = peak
            row[f"{name}_times_ms"] = times
            row[f"{name}_median_ms"] = statistics.median(times)
        for label, a, b in zip(("loss", "grad_hidden", "grad_weight"), results["default"], results["previous"]):
            row[f"{label}_rel_diff"] = rel(a, b)
        row["speedup"] = row["previous_median_ms"] / row["default_median_ms"]
        row["default_vs_compile"] = row["default_median_ms"] / row["torch_compile_median_ms"]
        rows.append(row)
        print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                          if not k.endswith("times_ms")}), flush=True)
        del hidden, weight, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / "amp-tiled-plan-ab.json", rows)


if __name__ == "__main__":
    main()
