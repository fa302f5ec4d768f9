"""Two planner questions for the tiled kernels, measured in one process before either is built.

1. **Wider blocks in pure bf16.** With the tiled kernels a block's backward writes its gradients
   as 2 bytes a logit into a buffer the planner sized at 4 (fp32 logits): the same bytes hold
   twice the columns. ``cols2x`` runs the default with ``vocab_chunk_size`` = twice the default
   plan's columns (its peak is larger here because the buffer is still sized at 4 bytes; the
   change would keep the default's peak), so only its time is the prediction.
2. **The tiled kernels under autocast.** With an fp32 weight the weight is converted chunk by
   chunk and the tiled kernels are off (they measured slower there, cause not found).
   ``tiles_chunked`` forces them on as they were; ``whole_bf16`` converts the whole weight once
   (what a planner could do where V·H·2 bytes fit the budget) and runs the bf16 path, at the
   default columns for a bf16 weight and at twice them. A CUDA-kernel profile of each amp
   variant's step shows where the time goes (kernel time against the step's wall time).

Per variant: the median of ``--repeats`` CUDA-event timings of one forward + backward, the peak
allocated above the inputs and gradients, and the gradients' relative difference from the
default's.

    python3 benchmarks/plan_probe.py --out $OUT        (on the device; writes plan-probe.json)
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import passes  # noqa: E402
from fusedce.block_math import TileMath  # noqa: E402
from fusedce.planner import plan_chunks  # noqa: E402
from benchmarks.tiles_ab import measure, probe_arguments, rel, save_with_environment  # noqa: E402

BF16_HEADS = ("8192x768x32777", "8192x4096x128256", "8192x2304x256000")
AMP_HEADS = ("8192x768x32777",)


def default_cols(n: int, h: int, v: int, hidden_dtype: torch.dtype, weight_dtype: torch.dtype) -> int:
    return plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype, compute_dtype=torch.bfloat16,
                       scalar_loss=True, needs_grad=True, cuda=True,
                       sm_count=torch.cuda.get_device_properties(0).multi_processor_count).cols


@contextlib.contextmanager
def tiles_forced():
    """The tiled kernels on whatever the weight's dtype (its converted chunks are bf16)."""
    original = passes._tile_math
    passes._tile_math = lambda block_math, weight, compute_dtype: (
        block_math if isinstance(block_math, TileMath) else None)
    try:
        yield
    finally:
        passes._tile_math = original


def step(hidden, weight, target, amp, whole_bf16=False, **options):
    hidden.grad = weight.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        w = weight.to(torch.bfloat16) if whole_bf16 else weight
        loss = fusedce.linear_cross_entropy(hidden, w, target, **options)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def kernel_profile(run, steps: int = 3) -> dict:
    """CUDA kernel time per step against the step's wall time, and the ten costliest kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            run()
        end.record()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total_us = sum(e.self_device_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {"step_wall_ms": start.elapsed_time(end) / steps, "step_kernel_ms": total_us / 1000 / steps,
            "kernel_launches_per_step": sum(e.count for e in events) / steps,
            "top": [{"name": e.key[:90], "calls_per_step": e.count / steps,
                     "ms_per_step": e.self_device_time_total / 1000 / steps} for e in top]}


def inputs(n, h, v, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, h, device="cuda", generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).to(dtype).requires_grad_()
    return hidden, weight, torch.randint(0, v, (n,), device="cuda", generator=gen)


def variants(head: str, amp: bool, n: int, h: int, v: int):
    """(name, step keyword arguments, context) of each variant of one head and mode."""
    if not amp:
        cols = default_cols(n, h, v, torch.bfloat16, torch.bfloat16)
        return [("default", {}, contextlib.nullcontext),
                ("cols2x", {"vocab_chunk_size": min(v, 2 * cols)}, contextlib.nullcontext)]
    cols = default_cols(n, h, v, torch.float32, torch.bfloat16)
    return [("default", {}, contextlib.nullcontext),
            ("tiles_chunked", {}, tiles_forced),
            ("whole_bf16", {"whole_bf16": True}, contextlib.nullcontext),
            ("whole_bf16_cols2x", {"whole_bf16": True, "vocab_chunk_size": min(v, 2 * cols)},
             contextlib.nullcontext)]


def main() -> None:
    args = probe_arguments()
    rows = []
    cases = [(head, False) for head in BF16_HEADS] + [(head, True) for head in AMP_HEADS]
    for head, amp in cases:
        n, h, v = (int(x) for x in head.split("x"))
        hidden, weight, target = inputs(n, h, v, torch.float32 if amp else torch.bfloat16)
        reference = None
        for name, options, context in variants(head, amp, n, h, v):
            with context():
                def run():
                    return step(hidden, weight, target, amp, **options)
                result, peak, times = measure(run, hidden, weight, args.repeats)
                profile = kernel_profile(run) if amp or h == 768 else None
            row = {"head": head, "mode": "amp" if amp else "bf16", "variant": name,
                   "options": {k: o for k, o in options.items()}, "peak_extra_bytes": peak,
                   "median_ms": statistics.median(times), "times_ms": times, "profile": profile}
            if reference is None:
                reference = result
            else:
                row.update({f"{k}_rel_diff": rel(a, b) for k, a, b in
                            zip(("loss", "grad_hidden", "grad_weight"), result, reference)})
            rows.append(row)
            print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                              if k not in ("times_ms", "profile")}), flush=True)
            if profile:
                print(f"   kernels {profile['step_kernel_ms']:.2f} ms of {profile['step_wall_ms']:.2f} ms a step, "
                      f"{profile['kernel_launches_per_step']:.0f} launches; top: "
                      + "; ".join(f"{t['name'][:40]} {t['ms_per_step']:.2f}" for t in profile["top"][:5]),
                      flush=True)
        del hidden, weight, target, reference
        torch.cuda.empty_cache()
    save_with_environment(args.out / "plan-probe.json", rows)


if __name__ == "__main__":
    main()
