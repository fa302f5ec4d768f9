"""``"min"`` under the planner's rule against the rule before it, in one process (an A/B of one change).

The rule now: ``"min"`` splits a bf16 weight's backward wherever one pass exceeds its budget (kept within
:data:`fusedce.split_plan.SPLIT_TIME_FACTOR`, 1.35, of the default's modelled time), and past 16384 rows a
block may be narrower than 1024 columns if it holds as many logits (:func:`fusedce.block_sizes.narrowest_cols`).
``previous_rule`` restores the rule before: a split only where one pass holds twice the budget, within
1.3 ×, and never under 1024 columns. Per pure bf16 head: ``"min"`` planned both ways and the default, each
the median of ``--repeats`` CUDA-event timings and the peak allocated above the inputs, and the relative
difference of the two ``"min"`` plans' loss and gradients; Liger and cut-cross-entropy beside them where
installed (their time and peak, for the dominance of ``"min"``: their errors are the frontier's to measure).

    python3 benchmarks/min_plan_ab.py --out $OUT        (on the device; writes min-plan-ab.json)
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusedce import block_sizes, min_plan, split_plan  # noqa: E402
from fusedce.planner import gradient_floor_bytes, plan_chunks  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from benchmarks.impls import backend_for  # noqa: E402
from benchmarks.split_backward_ab import bf16_inputs, budget_step, loss_step  # noqa: E402
from benchmarks.tiles_ab import add_differences, print_row, probe_arguments, save_with_environment, timed_variant  # noqa: E402,E501

HEADS = ("8192x2304x256000", "32768x4096x128256", "32768x3584x152064", "8192x4096x128256")


@contextlib.contextmanager
def previous_rule(on: bool):
    """The planner as it was before this rule (see the module docstring) while ``on``."""
    saved = (block_sizes.narrowest_cols, split_plan.narrowest_cols, min_plan.narrowest_cols, split_plan.split_backward,
             split_plan.SPLIT_TIME_FACTOR)
    if on:
        def old_narrowest(rows: int, v: int) -> int:
            return min(v, block_sizes.MIN_COLS)

        def split_at_twice(*args):  # every call passes its arguments by position; the last is `over`
            return saved[3](*args[:-1], split_plan.SPLIT_OVER_BUDGET)

        block_sizes.narrowest_cols = split_plan.narrowest_cols = min_plan.narrowest_cols = old_narrowest
        split_plan.split_backward, split_plan.SPLIT_TIME_FACTOR = split_at_twice, 1.3
    min_plan.within_time_of.cache_clear()
    try:
        yield
    finally:
        (block_sizes.narrowest_cols, split_plan.narrowest_cols, min_plan.narrowest_cols, split_plan.split_backward,
         split_plan.SPLIT_TIME_FACTOR) = saved
        min_plan.within_time_of.cache_clear()


def main() -> None:
    args = probe_arguments()
    rows = []
    for head in HEADS:
        hidden, weight, target = bf16_inputs(head)
        n, h, v = (int(x) for x in head.split("x"))
        row, results = {"head": head, "floor_bytes": gradient_floor_bytes(n, h, v, torch.bfloat16, torch.bfloat16)}, {}
        for name, budget in (("min", "min"), ("min_before", "min"), ("default", None)):
            with previous_rule(name == "min_before"):
                plan = plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                                   compute_dtype=torch.bfloat16, memory_budget=budget, scalar_loss=True,
                                   needs_grad=True, cuda=True, sm_count=132, tiled=True)
            row[f"{name}_plan"] = dataclasses.asdict(plan)
            run = budget_step(hidden, weight, target, budget, lambda before=name == "min_before": previous_rule(before))
            results[name] = timed_variant(row, name, run, hidden, weight, args.repeats)
            row[f"{name}_x_floor"] = 1 + row[f"{name}_peak_extra_bytes"] / row["floor_bytes"]
        for impl in ("liger", "cce"):
            try:
                peer = backend_for(impl).make()
            except ImportError:
                continue
            run = loss_step(hidden, weight, lambda peer=peer: peer(hidden, weight, target, None, LossOptions()))
            timed_variant(row, impl, run, hidden, weight, args.repeats)
            row[f"{impl}_x_floor"] = 1 + row[f"{impl}_peak_extra_bytes"] / row["floor_bytes"]
        add_differences(row, results["min"], results["min_before"])
        for name in ("min", "min_before"):
            row[f"{name}_time_x_default"] = row[f"{name}_median_ms"] / row["default_median_ms"]
        rows.append(row)
        print_row(row)
        del hidden, weight, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / "min-plan-ab.json", rows)


if __name__ == "__main__":
    main()
