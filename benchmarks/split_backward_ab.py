"""The split backward against the one-pass plan it replaces, in one process (an A/B of one change).

With a bf16 weight whose one-pass blocks would hold at least twice the budget, the backward runs in
two passes (:mod:`fusedce.split_plan`): exact gradients, one more logits recompute. ``one_pass``
restores the rule before by making :func:`fusedce.split_plan.split_backward` return None. Per pure
bf16 head, for the default budget and ``"min"``: median of ``--repeats`` CUDA-event timings, the peak
allocated above the inputs, and the relative difference of the loss and gradients; a variant whose
plan is the same either way is measured once.

    python3 benchmarks/split_backward_ab.py --out $OUT        (on the device; writes split-backward-ab.json)
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import min_plan, split_plan  # noqa: E402
from fusedce.planner import plan_chunks  # noqa: E402
from benchmarks.tiles_ab import add_differences, print_row, probe_arguments, save_with_environment, timed_variant  # noqa: E402,E501

HEADS = ("32768x4096x128256", "8192x4096x128256", "8192x5120x131072", "16384x3584x152064", "8192x2304x256000")


@contextlib.contextmanager
def one_pass(on: bool):
    """The planner without the split (every recompute backward in one pass)."""
    split = split_plan.split_backward
    if on:
        split_plan.split_backward = lambda *args, **kwargs: None
    min_plan.within_time_of.cache_clear()
    try:
        yield
    finally:
        split_plan.split_backward = split
        min_plan.within_time_of.cache_clear()


def bf16_inputs(head: str):
    """A pure bf16 head "NxHxV" on the GPU, seeded, logits of std ≈ 3; hidden and weight require gradients."""
    n, h, v = (int(x) for x in head.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, h, device="cuda", generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).bfloat16().requires_grad_()
    return hidden, weight, torch.randint(0, v, (n,), device="cuda", generator=gen)


def loss_step(hidden, weight, loss_fn, context=contextlib.nullcontext):
    """One forward (``loss_fn()``) and backward of ``hidden`` and ``weight``, inside ``context()``: a
    variant's ``run()`` for :func:`benchmarks.tiles_ab.timed_variant`, returning (loss, grad_hidden,
    grad_weight)."""
    def run():
        hidden.grad = weight.grad = None
        with context():
            loss = loss_fn()
            loss.backward()
        return loss.detach().float(), hidden.grad, weight.grad
    return run


def budget_step(hidden, weight, target, budget, planner_rule):
    """:func:`loss_step` of the fused loss at ``memory_budget=budget``, planned within ``planner_rule()``
    (a context that sets the planner's rule)."""
    return loss_step(hidden, weight,
                     lambda: fusedce.linear_cross_entropy(hidden, weight, target, memory_budget=budget), planner_rule)


def main() -> None:
    args = probe_arguments()
    rows = []
    for head in HEADS:
        hidden, weight, target = bf16_inputs(head)
        n, h, v = (int(x) for x in head.split("x"))
        for budget in (None, "min"):
            row, results = {"head": head, "budget": budget or "default"}, {}
            for name in ("split", "one_pass"):
                with one_pass(name == "one_pass"):
                    plan = plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                                       compute_dtype=torch.bfloat16, memory_budget=budget, cuda=True, sm_count=132,
                                       tiled=True)
                    row[f"{name}_plan"] = dataclasses.asdict(plan)
                    if name == "one_pass" and row["split_plan"] == row["one_pass_plan"]:
                        break

                    run = budget_step(hidden, weight, target, budget, lambda: one_pass(name == "one_pass"))
                    results[name] = timed_variant(row, name, run, hidden, weight, args.repeats)
            if "one_pass" in results:
                add_differences(row, results["split"], results["one_pass"])
                row["time_ratio"] = row["split_median_ms"] / row["one_pass_median_ms"]
                row["peak_saved_bytes"] = row["one_pass_peak_extra_bytes"] - row["split_peak_extra_bytes"]
            rows.append(row)
            print_row(row)
            del results
        del hidden, weight, target
        torch.cuda.empty_cache()
    save_with_environment(args.out / "split-backward-ab.json", rows)


if __name__ == "__main__":
    main()
