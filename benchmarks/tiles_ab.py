"""fusedce's default loss with and without the tiled kernels, in one process (an A/B of one change).

Per head and mode: the median of ``--repeats`` CUDA-event timings of one forward + backward of
``fusedce.linear_cross_entropy`` (default options and budget), the peak allocated above the
inputs and gradients, and the difference between the two paths' loss and gradients (relative
norm). The "blocks" path is the same code with ``fusedce.kernels.tiles_supported`` answering
False (cuBLAS into an fp32 block, then the block kernels).

    python3 benchmarks/tiles_ab.py --out $OUT        (on the device; writes tiles-ab.json)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce import kernels  # noqa: E402

HEADS = ("8192x768x32777", "8192x4096x128256", "8192x2304x256000")


def step(hidden, weight, target, mode):
    hidden.grad = weight.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "amp"):
        loss = fusedce.linear_cross_entropy(hidden, weight, target)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def measure(run, hidden, weight, repeats):
    """``run()`` (one forward + backward of ``hidden`` and ``weight``, returning (loss, grad_hidden,
    grad_weight)) once to warm up, once metered, ``repeats`` times timed: (its results, the peak
    allocated above the inputs and gradients, the CUDA-event times in ms)."""
    run()  # warm-up: compiles, workspaces
    torch.cuda.synchronize()
    hidden.grad = weight.grad = None
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = run()
    torch.cuda.synchronize()
    peak_extra = torch.cuda.max_memory_allocated() - base - hidden.numel() * hidden.element_size() \
        - weight.numel() * weight.element_size()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return result, peak_extra, times


def save_with_environment(path: Path, rows: list[dict]) -> None:
    """The rows and the environment block, as one JSON file."""
    from fusedce_profiler.instrument.environment import collect_environment

    path.write_text(json.dumps({"environment": collect_environment(), "results": rows}, indent=1))


def probe_arguments() -> argparse.Namespace:
    """``--out`` (made) and ``--repeats`` (default 9): the arguments every probe of the kernels takes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heads", nargs="*", default=list(HEADS))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tiled = kernels.tiles_supported
    rows = []
    for head in args.heads:
        n, h, v = (int(x) for x in head.split("x"))
        for mode in ("amp", "bf16"):
            dtype = torch.float32 if mode == "amp" else torch.bfloat16
            gen = torch.Generator(device="cuda").manual_seed(0)
            hidden = torch.randn(n, h, device="cuda", generator=gen).to(dtype).requires_grad_()
            weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).to(dtype).requires_grad_()
            target = torch.randint(0, v, (n,), device="cuda", generator=gen)
            row = {"head": head, "mode": mode}
            results = {}
            for path in ("blocks", "tiles"):
                kernels.tiles_supported = tiled if path == "tiles" else (lambda h_, w_: False)
                results[path], row[f"{path}_peak_extra_bytes"], times = measure(
                    lambda: step(hidden, weight, target, mode), hidden, weight, args.repeats)
                row[f"{path}_times_ms"] = times
                row[f"{path}_median_ms"] = statistics.median(times)
            kernels.tiles_supported = tiled
            for name, a, b in zip(("loss", "grad_hidden", "grad_weight"), results["tiles"], results["blocks"]):
                row[f"{name}_rel_diff"] = rel(a, b)
            row["speedup"] = row["blocks_median_ms"] / row["tiles_median_ms"]
            rows.append(row)
            print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                              if not isinstance(x, list)}), flush=True)
            del hidden, weight, target, results
            torch.cuda.empty_cache()
    save_with_environment(args.out / "tiles-ab.json", rows)


if __name__ == "__main__":
    main()
