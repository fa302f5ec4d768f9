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
import contextlib
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


def amp_inputs(head: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An amp head "NxHxV" on the GPU, seeded: bf16 hidden (N, H), an fp32 weight (V, H) scaled to
    logits of std ≈ 3, targets (N,); hidden and weight require gradients."""
    n, h, v = (int(x) for x in head.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, h, device="cuda", generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(v, h, device="cuda", generator=gen) * (3.0 / h ** 0.5)).requires_grad_()
    return hidden, weight, torch.randint(0, v, (n,), device="cuda", generator=gen)


def amp_step(hidden, weight, loss_fn, context=contextlib.nullcontext):
    """One forward (``loss_fn()`` under bf16 autocast, inside ``context()``) and backward: a variant's
    ``run()`` for :func:`measure`, returning the :data:`OUTPUTS`."""
    def run():
        hidden.grad = weight.grad = None
        with context():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn()
            loss.backward()
        return loss.detach().float(), hidden.grad, weight.grad
    return run


OUTPUTS = ("loss", "grad_hidden", "grad_weight")
"""What a variant's ``run()`` returns, in order."""


def timed_variant(row: dict, name: str, run, hidden, weight, repeats: int) -> tuple:
    """:func:`measure` one variant into ``row`` (``{name}_peak_extra_bytes``, ``{name}_times_ms``,
    ``{name}_median_ms``); its results, cloned (the next variant overwrites the gradients)."""
    result, row[f"{name}_peak_extra_bytes"], times = measure(run, hidden, weight, repeats)
    row[f"{name}_times_ms"] = times
    row[f"{name}_median_ms"] = statistics.median(times)
    return tuple(t.clone() for t in result)


def add_differences(row: dict, got: tuple, want: tuple, prefix: str = "") -> None:
    """The relative differences of two variants' :data:`OUTPUTS` into ``row`` (``{prefix}{output}_rel_diff``)."""
    for label, a, b in zip(OUTPUTS, got, want):
        row[f"{prefix}{label}_rel_diff"] = rel(a, b)


def print_row(row: dict) -> None:
    """One line of JSON: the row without its lists of times, floats to 4 significant digits."""
    print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                      if not k.endswith("times_ms")}), flush=True)


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
                results[path] = timed_variant(row, path, lambda: step(hidden, weight, target, mode), hidden, weight,
                                              args.repeats)
            kernels.tiles_supported = tiled
            add_differences(row, results["tiles"], results["blocks"])
            row["speedup"] = row["blocks_median_ms"] / row["tiles_median_ms"]
            rows.append(row)
            print_row(row)
            del hidden, weight, target, results
            torch.cuda.empty_cache()
    save_with_environment(args.out / "tiles-ab.json", rows)


if __name__ == "__main__":
    main()
