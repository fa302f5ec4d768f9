"""Balanced row chunks against the largest ones, under autocast, in one process (an A/B of one planner change).

Where a row chunk's fp32 grad_hidden sum does not fit two thirds of the default budget (an fp32
weight: N·H large against V·H), the planner used to take the largest rows that fit and leave the rest
to a thin last chunk, which walks the whole vocabulary again with narrow blocks. It now balances the
rows over the same number of chunks, and the bytes the rows no longer take go to the columns.

Per head (fp32 weight, ``--hidden-dtype`` hidden, bf16 autocast, default options): fusedce's default
as planned now; the same with the previous plan forced through ``chunk_size`` / ``vocab_chunk_size``
(:func:`previous_plan`, the old rule); and torch.compile of eager for the ratio. Each: median of
``--repeats`` CUDA-event timings of one forward + backward, the peak allocated above the inputs and
gradients, the block count, and the loss and gradients' difference between the two plans.

    python3 benchmarks/balanced_rows_ab.py --out $OUT        (on the device; writes balanced-rows-ab.json)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import block_sizes, planner  # noqa: E402
from benchmarks.tiles_ab import add_differences, print_row, save_with_environment, timed_variant  # noqa: E402

HEADS = ("8192x3072x32064", "16384x3584x152064", "32768x4096x128256", "8192x768x32777")


def previous_plan(n: int, h: int, v: int, hidden_dtype: torch.dtype) -> tuple[int, int]:
    """(rows, cols) of the planner before row balancing: the largest rows within two thirds of the
    default budget (fp32 weight, bf16 compute), then the columns that fit what is left."""
    floor = planner.gradient_floor_bytes(n, h, v, hidden_dtype, torch.float32)
    budget = planner.default_budget_bytes(floor, n)
    per_row = h * (4 + (2 if hidden_dtype != torch.bfloat16 else 0))
    share = budget * 2 // 3
    rows = n if n * per_row <= share else min(n, max(block_sizes.MIN_ROWS, share // per_row))
    cols = block_sizes.cols_within(v, rows, budget - rows * per_row, h * 2, None, 4)
    return rows, cols


def current_plan(n: int, h: int, v: int, hidden_dtype: torch.dtype) -> tuple[int, int]:
    plan = planner.plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=torch.float32,
                               compute_dtype=torch.bfloat16, scalar_loss=True, needs_grad=True, cuda=True,
                               sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    return plan.rows, plan.cols


def blocks(n: int, v: int, rows: int, cols: int) -> int:
    return -(-n // rows) * -(-v // cols)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heads", nargs="*", default=list(HEADS))
    parser.add_argument("--hidden-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hidden_dtype = getattr(torch, args.hidden_dtype)
    compiled = torch.compile(lambda h_, w_, t_: F.cross_entropy(F.linear(h_, w_).float(), t_))
    rows_out = []
    for head in args.heads:
        n, h, v = (int(x) for x in head.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(n, h, device="cuda", generator=gen).to(hidden_dtype).requires_grad_()
        weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).requires_grad_()
        target = torch.randint(0, v, (n,), device="cuda", generator=gen)
        old, new = previous_plan(n, h, v, hidden_dtype), current_plan(n, h, v, hidden_dtype)
        row = {"head": head, "hidden_dtype": args.hidden_dtype, "previous_plan": old, "plan": new,
               "previous_blocks": blocks(n, v, *old), "blocks": blocks(n, v, *new)}

        def run(loss_fn):
            def step():
                hidden.grad = weight.grad = None
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn()
                loss.backward()
                return loss.detach(), hidden.grad, weight.grad
            return step

        variants = {
            "balanced": run(lambda: fusedce.linear_cross_entropy(hidden, weight, target)),
            "previous": run(lambda: fusedce.linear_cross_entropy(hidden, weight, target, chunk_size=old[0],
                                                                 vocab_chunk_size=old[1])),
            "torch_compile": run(lambda: compiled(hidden, weight, target)),
        }
        results = {}
        for name, step in variants.items():
            results[name] = timed_variant(row, name, step, hidden, weight, args.repeats)
        add_differences(row, results["balanced"], results["previous"])
        row["speedup"] = row["previous_median_ms"] / row["balanced_median_ms"]
        row["balanced_vs_compile"] = row["balanced_median_ms"] / row["torch_compile_median_ms"]
        row["previous_vs_compile"] = row["previous_median_ms"] / row["torch_compile_median_ms"]
        rows_out.append(row)
        print_row(row)
        del hidden, weight, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / f"balanced-rows-ab-{args.hidden_dtype}.json", rows_out)


if __name__ == "__main__":
    main()
