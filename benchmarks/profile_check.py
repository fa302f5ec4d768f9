"""The default profiler grid on a GPU, and the memory-model check (a device script).

Runs, into ``OUT/grid`` (default ``$OUT``):
  the user's head (H=768, V=32777) and the Llama-3 head (H=4096, V=128256),
  tokens 1024, 4096, 16384, 65536, back-ends torch, torch-compile, fusedce, liger, cce,
  mode amp-bf16 — then, into ``OUT/snapshots-run``, torch and fusedce at N=4096 on the
  user's head with ``snapshot=True`` (memory-timeline PNGs). Prints one line per cell and
  checks the analytic prediction against the measured peak for torch and fusedce
  (within 5 % or 64 MiB); exits 1 if any such cell misses. Each line shows the
  measured/predicted peak of the step, of forward and of backward (GiB).

    python3 -m profiler.gpu_check [--out DIR] [--heads 768x32777] [--tokens 1024,4096]
                                  [--backends torch,fusedce] [--no-snapshots]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.instrument.records import CellResult
from fusedce_profiler.grid.runner import run_grid

HEADS = ((768, 32777), (4096, 128256))
TOKENS = (1024, 4096, 16384, 65536)
BACKENDS = ("torch", "torch-compile", "fusedce", "liger", "cce")
MODELLED = ("torch", "fusedce")
TOLERANCE, SLACK = 0.05, 64 * 2**20


def _gib(n: int | None) -> str:
    return f"{n / 2**30:8.3f}" if n is not None else "       -"


def _model_ok(result: CellResult) -> bool | None:
    if result.status != "ok" or result.predicted_bytes is None or result.spec.backend not in MODELLED:
        return None
    return abs(result.predicted_bytes - result.peak_step_bytes) <= max(TOLERANCE * result.peak_step_bytes, SLACK)


def _print(result: CellResult, started: float) -> None:
    s, p, extra = result.spec, result.parity, result.extra
    ratio = (f"{result.predicted_bytes / result.peak_step_bytes:6.3f}"
             if result.predicted_bytes and result.peak_step_bytes else "     -")
    check = {True: "ok", False: "MISS", None: ""}[_model_ok(result)]
    times = f"{result.time_ms:9.2f}" if result.time_ms is not None else "        -"
    errs = (f"{p.loss:.1e} {p.grad_hidden:.1e} {p.grad_weight:.1e}"
            if p.grad_hidden is not None else "")
    print(f"[{time.monotonic() - started:6.0f}s] {s.backend:13} H={s.hidden:<5} V={s.vocab:<6} N={s.tokens:<6} "
          f"{result.status:7} peak {_gib(result.peak_step_bytes)} GiB pred {_gib(result.predicted_bytes)} "
          f"pred/meas {ratio} {check:4} fwd {_gib(result.peak_forward_bytes)}/{_gib(extra.get('predicted_forward_bytes'))} "
          f"bwd {_gib(result.peak_backward_bytes)}/{_gib(extra.get('predicted_backward_bytes'))} "
          f"floor {_gib(result.floor_bytes)} ms {times} err {errs} {result.message[:160]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--heads", default=",".join(f"{h}x{v}" for h, v in HEADS), help="HxV,HxV")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--no-snapshots", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script, no GPU figures")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cell-timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    tokens = tuple(int(t) for t in args.tokens.split(","))
    backends = tuple(args.backends.split(","))
    out = Path(args.out)
    started = time.monotonic()
    results: list[CellResult] = []
    heads = [tuple(int(x) for x in head.split("x")) for head in args.heads.split(",")]
    for hidden, vocab in heads:
        grid = GridSpec(tokens=tokens, vocab=(vocab,), hidden=(hidden,), backends=backends, modes=("amp-bf16",),
                        device=args.device, repeats=args.repeats)
        results += run_grid(grid, out / "grid", resume=True, on_cell=lambda r: _print(r, started),
                            cell_timeout_s=args.cell_timeout)
    if not args.no_snapshots:
        snap = GridSpec(tokens=(4096,), vocab=(32777,), hidden=(768,), backends=MODELLED, modes=("amp-bf16",),
                        device=args.device, repeats=2)
        for result in run_grid(snap, out / "snapshots-run", resume=True, snapshot=True,
                               cell_timeout_s=args.cell_timeout):
            _print(result, started)
            print(f"    snapshot {result.snapshot_path}  timeline {result.timeline_png}")
    misses = [r for r in results if _model_ok(r) is False]
    checked = [r for r in results if _model_ok(r) is not None]
    print(f"memory model: {len(checked) - len(misses)}/{len(checked)} torch/fusedce cells within "
          f"{TOLERANCE:.0%} or {SLACK // 2**20} MiB; total {time.monotonic() - started:.0f} s")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
