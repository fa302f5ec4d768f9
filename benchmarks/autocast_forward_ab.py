"""Two questions about fusedce's own plans, each answered beside its peers in one process.

1. **The autocast forward in wide chunks.** With an fp32 weight under autocast, the forward used to
   convert a chunk of the plan's columns, multiply it into the fp32 block and reduce the block
   (three launches a block: 14 blocks at 8192×768×32777). It now converts as many weight rows as the
   block buffer's bytes hold beside their tile partials and multiplies and reduces each such chunk in
   one tiled launch (the whole vocabulary at that head). ``*_blocks`` variants force the previous
   path back (``passes.converting_tile_math`` patched to None) in the same process.
2. **Which plan ``"fast"`` should take.** ``"fast"`` plans the precompute strategy where it fits; in
   pure bf16 the tiled recompute of the default measured faster at the user's head (3.7 against
   4.6 ms, ``results/frontier-h100-2026-12-05/``). ``fast_recompute`` is ``"fast"``'s budget with
   ``strategy="recompute"``: fewer, wider tiled blocks than the default's.

Per head and variant: the median of ``--repeats`` CUDA-event timings of one forward + backward, the
peak allocated above the inputs and gradients, and the loss and gradients' relative difference from
the default's. Rows are appended to ``ab.jsonl`` as each head finishes (a cut-off run keeps them).

    python3 benchmarks/autocast_forward_ab.py --out $OUT        (on the device)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import passes  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from fusedce_profiler.instrument.backends import get_backend  # noqa: E402
from benchmarks.tiles_ab import measure, rel, save_with_environment  # noqa: E402

# (mode, head, bias): amp = fp32 weight, bf16 hidden, bf16 autocast; bf16 = bf16 weight and hidden
CASES = (
    ("amp", "8192x768x32777", False), ("bf16", "8192x768x32777", False),
    ("amp", "8192x3072x32064", False), ("amp", "8192x4096x128256", False), ("bf16", "8192x4096x128256", False),
    ("amp", "8192x2304x256000", False), ("bf16", "8192x2304x256000", False), ("bf16", "8192x5120x131072", True),
    ("bf16", "32768x4096x128256", False),
)


@contextlib.contextmanager
def block_forward():
    """The autocast forward as before: one converted chunk, product and reduction per block."""
    original = passes.converting_tile_math
    passes.converting_tile_math = lambda block_math, weight, compute_dtype: None
    try:
        yield
    finally:
        passes.converting_tile_math = original


def variants(mode: str, hidden, weight, target, bias):
    """name → a callable running one forward + backward and returning (loss, grad_hidden, grad_weight)."""
    def fused(**options):
        return lambda: fusedce.linear_cross_entropy(hidden, weight, target, bias=bias, **options)

    def peer(name):
        loss = get_backend(name).make()
        return lambda: loss(hidden, weight, target, bias, LossOptions())

    chosen = {"default": fused(), "fast": fused(memory_budget="fast"),
              "fast_recompute": fused(memory_budget="fast", strategy="recompute"),
              "min": fused(memory_budget="min"), "torch_compile": peer("torch-compile")}
    if mode == "amp":
        chosen["default_blocks"] = ("blocks", chosen["default"])
        chosen["min_blocks"] = ("blocks", chosen["min"])
    else:
        chosen["liger"] = peer("liger")
    return chosen


def run_step(fn, hidden, weight, bias, mode: str, blocks: bool):
    def step():
        hidden.grad = weight.grad = None
        if bias is not None:
            bias.grad = None
        with block_forward() if blocks else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=torch.bfloat16) if mode == "amp" else contextlib.nullcontext():
                loss = fn()
            loss.backward()
        return loss.detach().float(), hidden.grad, weight.grad
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--cases", type=int, nargs="*", help="indices into CASES (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in args.cases if args.cases is not None else range(len(CASES)):
        mode, head, with_bias = CASES[index]
        n, h, v = (int(x) for x in head.split("x"))
        torch._dynamo.reset()
        gen = torch.Generator(device="cuda").manual_seed(index)
        hidden = torch.randn(n, h, device="cuda", generator=gen).bfloat16().requires_grad_()
        weight = torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)
        weight = (weight if mode == "amp" else weight.bfloat16()).requires_grad_()
        bias = (torch.randn(v, device="cuda", generator=gen).to(weight.dtype).requires_grad_() if with_bias
                else None)
        target = torch.randint(0, v, (n,), device="cuda", generator=gen)
        row = {"mode": mode, "head": head, "bias": with_bias}
        results = {}
        for name, fn in variants(mode, hidden, weight, target, bias).items():
            blocks = isinstance(fn, tuple)
            fn = fn[1] if blocks else fn
            started = time.perf_counter()
            try:
                result, peak, times = measure(run_step(fn, hidden, weight, bias, mode, blocks), hidden, weight,
                                              args.repeats)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is recorded, the run goes on
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            results[name] = tuple(t.clone() for t in result)
            row[f"{name}_peak_extra_bytes"] = peak
            row[f"{name}_times_ms"] = times
            row[f"{name}_median_ms"] = statistics.median(times)
            row[f"{name}_wall_s"] = round(time.perf_counter() - started, 1)
        for name, result in results.items():
            if name != "default" and "default" in results:
                for label, a, b in zip(("loss", "grad_hidden", "grad_weight"), result, results["default"]):
                    row[f"{name}_{label}_rel_diff"] = rel(a, b)
        rows.append(row)
        with open(args.out / "ab.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                          if not k.endswith("times_ms") and "rel_diff" not in k}), flush=True)
        del hidden, weight, bias, target, results
        torch.cuda.empty_cache()
    save_with_environment(args.out / "autocast-forward-ab.json", rows)


if __name__ == "__main__":
    main()
