"""fusedce side by side with eager torch, torch.compile, Liger-Kernel and cut-cross-entropy.

Runs the protocol of ``shared/ANCHORS.md`` (see :mod:`benchmarks.measure`) over rows
(N×H×V) × modes (amp, bf16) × implementations in one process, on the same inputs for
every implementation, and writes ``<out>/<gpu-slug>-<YYYY-MM-DD>[-variant].json`` (rewritten
after every cell, so an interrupted run keeps what it measured) plus the Markdown table
``.md`` beside it. Per row it also measures the cuBLAS bf16 GEMM rate, the yardstick of
the speed stretch goal.

    python3 benchmarks/bench_lce.py --out DIR                      # the ANCHORS rows, all impls
    python3 benchmarks/bench_lce.py --out DIR --ignore-frac 0.3    # goal-4 variant: ignored targets
    python3 benchmarks/bench_lce.py --out DIR --all-options        # goal-4 variant: every option on
    python3 benchmarks/bench_lce.py --out DIR --device cpu --rows 64x32x97 --impls torch fusedce

Duration of the default run on one H200 (an estimate, not yet timed): about 3–4 minutes,
mostly warm-ups (torch.compile compiles 8 static-shape graphs, one per row and mode;
Liger, cut-cross-entropy and fusedce JIT-compile their Triton kernels); the measured steps
themselves take about 30 s and the fp32 references about 10 s. Each cell's warm-up time
is in ``extra["warmup_ms"]`` and printed as the run goes.

Exit status: 0, or 1 with ``--check`` when a fusedce cell misses goal 1, 2 or 3 (or did not
run), 2 on bad arguments or an existing output file (``--overwrite`` replaces it).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.goals import check_goals
from benchmarks.impls import ALL_IMPLS, IMPLS, backend_for
from benchmarks.measure import measure_cell, measure_gemm
from fusedce_profiler.instrument.protocol import settle
from benchmarks.protocol import (ALL_OPTIONS_LABEL_SMOOTHING, ALL_OPTIONS_SOFTCAP, ALL_OPTIONS_Z_LOSS,
                                 ANCHOR_ROWS, MODES, make_inputs, parse_row)
from benchmarks.render import fmt_error, fmt_ms, render_console, render_markdown
from benchmarks.results import BenchRun, BenchSettings, collect_environment, result_stem, save_run
from fusedce_profiler.instrument.backends import options_of
from fusedce_profiler.instrument.records import CellResult, CellSpec
from fusedce_profiler.instrument.reference import reference as fp32_reference


def _row_arg(text: str) -> str:
    try:
        return parse_row(text).shape
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"--ignore-frac must be in [0, 1), got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--repeats must be at least 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="LM-head losses side by side (shared/ANCHORS.md protocol).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and Markdown results")
    parser.add_argument("--rows", nargs="+", type=_row_arg, default=[row.shape for row in ANCHOR_ROWS],
                        metavar="NxHxV", help="shapes to measure (tokens x hidden x vocab)")
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["amp", "bf16"],
                        help="amp: fp32 weight under bf16 autocast; bf16: bf16 weight")
    parser.add_argument("--impls", nargs="+", choices=list(ALL_IMPLS), default=list(IMPLS),
                        help="implementations, measured in this order")
    parser.add_argument("--ignore-frac", type=_fraction, default=0.0,
                        help="fraction of targets set to ignore_index (goal-4 variant: 0.3)")
    parser.add_argument("--all-options", action="store_true",
                        help=f"bias + label smoothing {ALL_OPTIONS_LABEL_SMOOTHING} + z-loss {ALL_OPTIONS_Z_LOSS} "
                             f"+ soft-cap {ALL_OPTIONS_SOFTCAP:g}")
    parser.add_argument("--repeats", type=_positive, default=5, help="timed calls per cell (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: wall-clock timing, no memory numbers (a smoke test of the code path)")
    parser.add_argument("--tag", default="", help="extra suffix of the result file names")
    parser.add_argument("--overwrite", action="store_true", help="replace existing result files")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every fusedce cell meets goals 1-3")
    return parser


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(rows=list(dict.fromkeys(args.rows)), modes=list(dict.fromkeys(args.modes)),
                         impls=list(dict.fromkeys(args.impls)), device=args.device, repeats=args.repeats,
                         seed=args.seed, ignore_frac=args.ignore_frac, all_options=args.all_options, tag=args.tag)


def cell_spec(settings: BenchSettings, shape: str, mode: str, backend: str) -> CellSpec:
    """The CellSpec of one (row, command-line mode, implementation) under ``settings``."""
    row = parse_row(shape)
    everything = settings.all_options
    return CellSpec(backend=backend, tokens=row.tokens, vocab=row.vocab, hidden=row.hidden, mode=MODES[mode],
                    device=settings.device, bias=everything, ignore_frac=settings.ignore_frac,
                    label_smoothing=ALL_OPTIONS_LABEL_SMOOTHING if everything else 0.0,
                    z_loss=ALL_OPTIONS_Z_LOSS if everything else 0.0,
                    softcap=ALL_OPTIONS_SOFTCAP if everything else None, seed=settings.seed)


def _progress(cell: CellResult) -> str:
    s = cell.spec
    what = f"{s.tokens}x{s.hidden}x{s.vocab} {s.mode:8} {s.backend:13}"
    if cell.status != "ok":
        return f"{what} {cell.status}: {cell.message}"
    peak = f"{cell.peak_step_bytes / 2**30:7.3f} GiB" if cell.peak_step_bytes is not None else "      – GiB"
    return (f"{what} {peak} {fmt_ms(cell.time_ms):>7} ms  warm-up {cell.extra['warmup_ms'] / 1e3:6.1f} s  "
            f"err h {fmt_error(cell.parity.grad_hidden)} W {fmt_error(cell.parity.grad_weight)}")


def run_benchmark(settings: BenchSettings, out: Path, *, overwrite: bool = False,
                  log: Callable[[str], None] = print) -> tuple[BenchRun, Path, Path]:
    """Measure every (row, mode, impl) of ``settings``; returns the run and its JSON/Markdown paths.

    Raises ``FileExistsError`` when a result file exists and ``overwrite`` is false, and
    ``ValueError`` for ``device="cuda"`` without CUDA.
    """
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device (use --device cpu for a smoke run)")
    started = time.perf_counter()
    run = BenchRun(collect_environment(settings.device), settings)
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(run.environment, settings)
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    for path in (json_path, md_path):
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists (pass --overwrite to replace it, or a --tag)")

    def record() -> None:
        run.wall_s = time.perf_counter() - started
        save_run(run, json_path)
        md_path.write_text(render_markdown(run))

    for shape in settings.rows:
        row = parse_row(shape)
        run.rows.append(row)
        rate = measure_gemm(row, device=settings.device, repeats=settings.repeats, seed=settings.seed)
        run.gemm.append(rate)
        log(f"{shape} bf16 GEMM: {rate.tflops:.0f} TFLOP/s" if rate.tflops else f"{shape} GEMM: {rate.message}")
        for mode in settings.modes:
            base = cell_spec(settings, shape, mode, backend="")
            inputs = make_inputs(row, base.mode, device=settings.device, seed=settings.seed,
                                 ignore_frac=settings.ignore_frac, bias=base.bias)
            reference = fp32_reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias,
                                       options_of(base))
            for name in settings.impls:
                cell = measure_cell(backend_for(name), dataclasses.replace(base, backend=name), inputs, reference,
                                    repeats=settings.repeats)
                run.cells.append(cell)
                log(_progress(cell))
                record()
            del inputs, reference
            settle(settings.device)
    record()
    return run, json_path, md_path


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    try:
        run, json_path, md_path = run_benchmark(settings, args.out, overwrite=args.overwrite,
                                                log=lambda line: print(line, flush=True))
    except (FileExistsError, ValueError) as exc:
        print(f"bench_lce: {exc}", file=sys.stderr)
        return 2
    print()
    print(render_console(run))
    print(f"\nwrote {json_path} and {md_path} ({run.wall_s:.0f} s)")
    if args.check:
        rates = {(r.tokens, r.hidden, r.vocab): r.tflops for r in run.gemm}
        missed = [c for c in check_goals(run.cells, rates) if not c.met()]
        for check in missed:
            s = check.spec
            print(f"goal missed: {s.tokens}x{s.hidden}x{s.vocab} {s.mode}: memory {check.memory}, "
                  f"time {check.time}, parity {check.parity}", file=sys.stderr)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
