"""Would the tiled kernels pay in the autocast backward? Measured in one process before building it.

Under autocast (an fp32 weight converted chunk by chunk) the backward runs each block through cuBLAS
(fp32 logits written) and the block kernel (read back, bf16 gradients written): five launches a
block. The tiled kernel would compute the gradients from the converted chunk without the fp32 logits
(four launches a block), and its block needs 2 bytes a logit, not 4: the same budget holds twice the
columns, half the blocks. Design 10 measured tiled launches per block slower on the host; this probe
asks whether half the blocks repay it.

Variants per amp head (fp32 weight, bf16 hidden, bf16 autocast, default budget):

- ``default``: as planned (the forward in wide chunks, the backward on the block kernels);
- ``tiles``: the tiled kernels allowed for converted chunks (``plan_probe.tiles_forced``), same plan;
- ``tiles_2x``: the same with twice the plan's columns (``vocab_chunk_size``): the block count a tiled
  plan would have. Its buffer is still sized at 4 bytes a logit here, so only its time is the prediction;
- ``torch_compile`` for the ratio.

Median of ``--repeats`` CUDA-event timings, peak allocated above the inputs, the difference of the
loss and gradients from the default's.

    python3 benchmarks/amp_tiles_probe.py --out $OUT        (on the device; writes amp-tiles-probe.json)
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import planner  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from fusedce_profiler.instrument.backends import get_backend  # noqa: E402
from benchmarks.plan_probe import tiles_forced
from benchmarks.tiles_ab import (add_differences, amp_inputs, amp_step, print_row, probe_arguments,  # noqa: E402
                                 save_with_environment, timed_variant)

HEADS = ("8192x768x32777", "8192x3072x32064", "8192x4096x128256")


def main() -> None:
    args = probe_arguments()
    rows = []
    for head in HEADS:
        n, h, v = (int(x) for x in head.split("x"))
        torch._dynamo.reset()
        hidden, weight, target = amp_inputs(head)
        plan = planner.plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=torch.float32,
                                   compute_dtype=torch.bfloat16, scalar_loss=True, needs_grad=True, cuda=True,
                                   sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
        compiled = get_backend("torch-compile").make()
        variants = {
            "default": (False, {}),
            "tiles": (True, {}),
            "tiles_2x": (True, {"chunk_size": plan.rows, "vocab_chunk_size": 2 * plan.cols}),
            "torch_compile": (False, None),
        }
        row = {"head": head, "plan": [plan.rows, plan.cols]}
        results = {}
        for name, (tiled, options) in variants.items():
            step = amp_step(hidden, weight, (lambda: compiled(hidden, weight, target, None, LossOptions()))
                            if options is None else
                            lambda options=options: fusedce.linear_cross_entropy(hidden, weight, target, **options),
                            context=tiles_forced if tiled else contextlib.nullcontext)
            results[name] = timed_variant(row, name, step, hidden, weight, args.repeats)
        for name in ("tiles", "tiles_2x"):
            add_differences(row, results[name], results["default"], prefix=f"{name}_")
        rows.append(row)
        print_row(row)
        del hidden, weight, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / "amp-tiles-probe.json", rows)


if __name__ == "__main__":
    main()
