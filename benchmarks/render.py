"""Render a benchmark results JSON as the Markdown table of ``../shared/ANCHORS.md``.

A pure function of the results file, so the README's performance table can be rebuilt
from the committed JSON without a GPU::

    python3 benchmarks/render.py benchmarks/results/nvidia-h200-2026-12-02.json [-o table.md]

Columns: peak extra GiB, × floor, ms, TFLOP/s (6·N·H·V over the median time), % of the
measured bf16 GEMM rate, relative errors of loss / grad_h / grad_W vs the fp32
reference, and for fusedce the goal checks (memory ≤ 1.10 × floor + 128 MiB, time ≤
torch_compile, parity ≤ eager torch; the 80%-of-GEMM stretch in brackets).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.goals import SUBJECT, GoalCheck, check_goals, group_key
from benchmarks.protocol import (ALL_OPTIONS_LABEL_SMOOTHING, ALL_OPTIONS_SOFTCAP, ALL_OPTIONS_Z_LOSS,
                                 GEMM_STRETCH_FRACTION, GIB, MEMORY_GOAL_FACTOR, MEMORY_GOAL_SLACK_BYTES, MIB,
                                 MODE_LABELS, Row, memory_goal_bytes, step_flops, tflops)
from benchmarks.results import BenchRun, load_run
from fusedce_profiler.instrument.records import CellResult

HEADER = ("N×H×V", "mode", "impl", "peak extra GiB", "× floor", "ms", "TFLOP/s", "% GEMM",
          "rel err loss", "rel err grad_h", "rel err grad_W", "goals: mem · time · parity (stretch)")
_MARK = {True: "✓", False: "✗", None: "–"}


def fmt_error(value: float | None) -> str:
    """Relative errors: 4 decimals as in ANCHORS.md, scientific below 1e-4."""
    if value is None:
        return "–"
    return f"{value:.4f}" if value >= 1e-4 or value == 0 else f"{value:.1e}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def fmt_rate(value: float | None) -> str:
    """TFLOP/s: whole numbers, two significant digits below 10 (CPU smoke runs)."""
    if value is None:
        return "–"
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def fmt_goals(check: GoalCheck | None) -> str:
    if check is None:
        return ""
    return (f"{_MARK[check.memory]} · {_MARK[check.time]} · {_MARK[check.parity]} "
            f"({_MARK[check.gemm_stretch]})")


def _row_label(run: BenchRun, cell: CellResult) -> str:
    shape = f"{cell.spec.tokens}×{cell.spec.hidden}×{cell.spec.vocab}"
    for row in run.rows:
        if (row.tokens, row.hidden, row.vocab) == (cell.spec.tokens, cell.spec.hidden, cell.spec.vocab) and row.label:
            return f"{shape} ({row.label})"
    return shape


def _gemm_rates(run: BenchRun) -> dict[tuple[int, int, int], float | None]:
    return {(rate.tokens, rate.hidden, rate.vocab): rate.tflops for rate in run.gemm}


def cell_columns(cell: CellResult, gemm_tflops: float | None) -> list[str]:
    """The measured columns of one cell (peak extra GiB … rel err grad_W)."""
    if cell.status != "ok":
        status = "OOM" if cell.status == "oom" else cell.status
        return [status] + ["–"] * 7
    peak = cell.peak_step_bytes
    achieved = tflops(step_flops(Row(cell.spec.tokens, cell.spec.hidden, cell.spec.vocab)), cell.time_ms)
    return [
        f"{peak / GIB:.3f}" if peak is not None else "–",
        f"{peak / cell.floor_bytes:.2f}" if peak is not None and cell.floor_bytes else "–",
        fmt_ms(cell.time_ms),
        fmt_rate(achieved),
        f"{100 * achieved / gemm_tflops:.0f}%" if gemm_tflops else "–",
        fmt_error(cell.parity.loss),
        fmt_error(cell.parity.grad_hidden),
        fmt_error(cell.parity.grad_weight),
    ]


def table_lines(run: BenchRun) -> list[list[str]]:
    """One list of strings per cell, in run order; the shape is written once per row."""
    rates = _gemm_rates(run)
    checks = {group_key(check.spec): check for check in check_goals(run.cells, rates)}
    lines, previous_shape = [], None
    for cell in run.cells:
        shape = (cell.spec.tokens, cell.spec.hidden, cell.spec.vocab)
        label = _row_label(run, cell) if shape != previous_shape else ""
        previous_shape = shape
        check = checks.get(group_key(cell.spec)) if cell.spec.backend == SUBJECT else None
        lines.append([label, MODE_LABELS.get(cell.spec.mode, cell.spec.mode), cell.spec.backend,
                      *cell_columns(cell, rates.get(shape)), fmt_goals(check)])
    return lines


def _markdown_table(header: tuple[str, ...] | list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def floors_table(run: BenchRun) -> str:
    """Per (row, mode): the memory floor, goal 1's limit, the GEMM rate and the time floor."""
    seen, lines = set(), []
    for cell in run.cells:
        key = (cell.spec.tokens, cell.spec.hidden, cell.spec.vocab, cell.spec.mode)
        if key in seen or cell.floor_bytes is None:
            continue
        seen.add(key)
        rate = run.gemm_rate(*key[:3])
        flops = step_flops(Row(*key[:3]))
        floor_ms = flops / (rate.tflops * 1e12) * 1e3 if rate and rate.tflops else None
        lines.append([f"{key[0]}×{key[1]}×{key[2]}", MODE_LABELS.get(key[3], key[3]),
                      f"{cell.floor_bytes / GIB:.3f}", f"{memory_goal_bytes(cell.floor_bytes) / GIB:.3f}",
                      fmt_rate(rate.tflops if rate else None), fmt_ms(floor_ms)])
    header = ("N×H×V", "mode", "floor GiB", "goal ≤ GiB", "bf16 GEMM TFLOP/s (measured)",
              "6·N·H·V at that rate, ms")
    return _markdown_table(header, lines)


def _options_line(run: BenchRun) -> str:
    s = run.settings
    options = []
    if s.ignore_frac:
        options.append(f"{s.ignore_frac:.0%} ignored targets")
    if s.all_options:
        options.append(f"bias + label smoothing {ALL_OPTIONS_LABEL_SMOOTHING} + z-loss {ALL_OPTIONS_Z_LOSS:g} "
                       f"+ soft-cap {ALL_OPTIONS_SOFTCAP:g}")
    return ", ".join(options) or "no ignored targets, no bias, no label smoothing / z-loss / soft-cap"


def render_markdown(run: BenchRun) -> str:
    """The whole report: environment, the side-by-side table, the floors, the non-ok cells."""
    env = run.environment
    notes = [f"- {_row_label(run, c)} {MODE_LABELS.get(c.spec.mode, c.spec.mode)} {c.spec.backend}: "
             f"{c.status}: {c.message}" for c in run.cells if c.status != "ok"]
    parts = [
        f"# LM-head losses side by side: {env.gpu}, {env.date[:10]}",
        "",
        f"torch {env.torch}, CUDA {env.cuda or '–'}, driver {env.driver or '–'}, triton {env.triton}, "
        f"liger-kernel {env.liger_kernel or 'not installed'}, cut-cross-entropy "
        f"{env.cut_cross_entropy or 'not installed'}, fusedce {env.fusedce} ({env.fusedce_commit or 'no commit'}), "
        f"PYTORCH_CUDA_ALLOC_CONF={env.pytorch_cuda_alloc_conf or '(unset)'}.",
        f"Options: {_options_line(run)}. Time: median of {run.settings.repeats} forward+backward calls "
        f"after one warm-up; protocol in `benchmarks/measure.py`.",
        "",
        _markdown_table(HEADER, table_lines(run)),
        "",
        f"Goals (fusedce): mem = peak extra ≤ {MEMORY_GOAL_FACTOR:.2f} × floor + "
        f"{MEMORY_GOAL_SLACK_BYTES // MIB} MiB; time = ms ≤ torch_compile's; parity = every rel err ≤ eager "
        f"torch's; (stretch) = TFLOP/s ≥ {GEMM_STRETCH_FRACTION:.0%} of the measured bf16 GEMM rate. "
        "✓ met, ✗ missed, – not measurable in this run.",
        "",
        floors_table(run),
    ]
    if notes:
        parts += ["", "Cells without numbers:", "", *notes]
    return "\n".join(parts) + "\n"


def render_console(run: BenchRun) -> str:
    """A terse fixed-width table for the terminal (same columns, no environment)."""
    header = ["N×H×V", "mode", "impl", "GiB", "×floor", "ms", "TFLOP/s", "%GEMM", "err loss",
              "err g_h", "err g_W", "goals"]
    lines = [[line[0].split(" (")[0], *line[1:]] for line in table_lines(run)]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
                     for line in [header, *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render a bench_lce results JSON as Markdown.")
    parser.add_argument("results", type=Path, help="the results JSON written by bench_lce.py")
    parser.add_argument("-o", "--output", type=Path, help="write the Markdown here instead of stdout")
    args = parser.parse_args(argv)
    text = render_markdown(load_run(args.results))
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
