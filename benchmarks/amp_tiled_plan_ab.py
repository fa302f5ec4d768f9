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

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import passes  # noqa: E402
from fusedce.kernels import tiles  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from fusedce_profiler.instrument.backends import get_backend  # noqa: E402
from benchmarks.tiles_ab import (add_differences, amp_inputs, amp_step, print_row, probe_arguments,  # noqa: E402
                                 save_with_environment, timed_variant)

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
    args = probe_arguments()
    rows = []
    for head in HEADS:
        torch._dynamo.reset()
        hidden, weight, target = amp_inputs(head)
        compiled = get_backend("torch-compile").make()
        row, results = {"head": head}, {}
        for name in ("default", "previous", "torch_compile"):
            loss_fn = ((lambda: compiled(hidden, weight, target, None, LossOptions())) if name == "torch_compile"
                       else lambda: fusedce.linear_cross_entropy(hidden, weight, target))
            step = amp_step(hidden, weight, loss_fn, context=lambda name=name: previous_rule(name == "previous"))
            results[name] = timed_variant(row, name, step, hidden, weight, args.repeats)
        add_differences(row, results["default"], results["previous"])
        row["speedup"] = row["previous_median_ms"] / row["default_median_ms"]
        row["default_vs_compile"] = row["default_median_ms"] / row["torch_compile_median_ms"]
        rows.append(row)
        print_row(row)
        del hidden, weight, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / "amp-tiled-plan-ab.json", rows)


if __name__ == "__main__":
    main()
