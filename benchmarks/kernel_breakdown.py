"""Where fusedce's time goes: one forward+backward per (row, mode), timed with CUDA events
and traced with ``torch.profiler``: GPU time per kind of kernel, and per matrix product.

    python3 benchmarks/kernel_breakdown.py --out $OUT [--rows 8192x768x32777 ...] [--budgets default fast]

Kinds: ``gemm`` (cuBLAS/CUTLASS matrix products), ``chunk_stats`` / ``logit_grad`` (fusedce's
Triton kernels), ``convert`` (dtype copies: the fp32 weight to bf16 under autocast),
``other`` (small elementwise and reduction kernels). The wall time minus the summed kernel
time is GPU idle time (kernel launches from Python not keeping up). Writes
``kernel-breakdown.json`` and prints one table; ``benchmarks/NOTES.md`` quotes these files.
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
from fusedce_profiler.instrument.protocol import settle  # noqa: E402
from benchmarks.protocol import parse_row  # noqa: E402
from fusedce_profiler.instrument.environment import collect_environment  # noqa: E402
from fusedce_profiler.grid.inputs import make_inputs  # noqa: E402
from fusedce_profiler.instrument.precision import autocast  # noqa: E402
from fusedce_profiler.instrument.records import CellSpec  # noqa: E402

DEFAULT_ROWS = ("8192x768x32777", "8192x4096x128256")
KINDS = ("gemm", "chunk_stats", "logit_grad", "convert", "other")


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    if "chunk_stats" in lowered:
        return "chunk_stats"
    if "logit_grad" in lowered:
        return "logit_grad"
    if any(key in lowered for key in ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")):
        return "gemm"
    if "copy" in lowered or "cast" in lowered:
        return "convert"
    return "other"


def run_case(spec: CellSpec, repeats: int, budget: str = "default") -> dict:
    """One (row, mode, budget): the median step time of ``repeats``, the peak beyond the inputs, and
    one traced step's GPU time per kernel kind (:data:`KINDS`) and per matrix product."""
    inputs = make_inputs(spec)
    options = {} if budget == "default" else {"memory_budget": budget}

    def step() -> None:
        inputs.clear_grads()
        with autocast(spec.mode, spec.device):
            loss = fusedce.linear_cross_entropy(inputs.hidden, inputs.weight, inputs.target, **options)
        loss.backward()

    step()  # warm-up: Triton compilation, cuBLAS workspaces
    inputs.clear_grads()
    settle("cuda")
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak_extra = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    per_kind = dict.fromkeys(KINDS, 0.0)
    counts = dict.fromkeys(KINDS, 0)
    matmuls = []  # the GEMM-launching aten ops by input shapes: which product is slow
    for event in prof.key_averages(group_by_input_shape=True):
        device_us = _device_us(event)
        if event.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm") and device_us:
            matmuls.append({"op": event.key, "shapes": str(event.input_shapes), "calls": event.count,
                            "device_ms": device_us / 1000.0})
    matmuls.sort(key=lambda item: -item["device_ms"])
    for event in prof.key_averages():
        device_us = _device_us(event)
        on_gpu = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if not device_us or not on_gpu or event.key.startswith("ProfilerStep"):
            continue
        kind = kernel_kind(event.key)
        per_kind[kind] += device_us / 1000.0
        counts[kind] += event.count
    return {
        "tokens": spec.tokens, "hidden": spec.hidden, "vocab": spec.vocab, "mode": spec.mode, "budget": budget,
        "median_ms": statistics.median(times), "times_ms": times,
        "peak_extra_bytes": peak_extra, "kernel_ms": per_kind, "kernel_launches": counts,
        "matmuls": matmuls[:12],
    }


def _device_us(event) -> float:
    return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0) or 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS))
    parser.add_argument("--modes", nargs="+", default=["amp-bf16", "bf16"], choices=["amp-bf16", "bf16"])
    parser.add_argument("--budgets", nargs="+", default=["default"], choices=["default", "fast", "min"],
                        help="fusedce's memory_budget: the default, or a named point")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        rows = [parse_row(text) for text in args.rows]
    except ValueError as exc:
        parser.error(f"--rows: {exc}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for text, row in zip(args.rows, rows):
        for mode, budget in [(m, b) for m in args.modes for b in args.budgets]:
            spec = CellSpec("fusedce", row.tokens, row.vocab, row.hidden, mode=mode, device="cuda")
            try:
                result = run_case(spec, args.repeats, budget)
            except torch.cuda.OutOfMemoryError as exc:
                result = {"tokens": row.tokens, "hidden": row.hidden, "vocab": row.vocab, "mode": mode,
                          "budget": budget, "error": str(exc).splitlines()[0]}
            torch.cuda.empty_cache()
            results.append(result)
            if "error" in result:
                print(f"{text} {mode} {budget}: {result['error']}", flush=True)
                continue
            kinds = " ".join(f"{k}={result['kernel_ms'][k]:.2f}" for k in KINDS)
            print(f"{text} {mode:8s} {budget:7s} {result['median_ms']:8.2f} ms {result['peak_extra_bytes'] / 2**20:8.1f} MiB"
                  f" | {kinds}", flush=True)
            for item in result["matmuls"][:5]:
                print(f"    {item['device_ms']:7.2f} ms  {item['calls']:4d}× {item['op']} {item['shapes']}", flush=True)
    payload = {"environment": collect_environment(), "results": results}
    (args.out / "kernel-breakdown.json").write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
