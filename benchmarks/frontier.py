"""The time–memory frontier on one GPU: every LM-head loss and every fusedce point, side by side.

Per *case* (an N×H×V row, a mode, and the options that define it: Gemma-2's soft-cap 30,
Mistral-NeMo's bias), on inputs shared by every implementation and one fp32 reference,
each implementation is measured by the ANCHORS protocol (:func:`benchmarks.measure.measure_cell`:
one warm-up, the metered forward+backward with the ``.grad`` tensors counted, parity,
the median of ``--repeats`` CUDA-event timings), and the row's cuBLAS bf16 GEMM rate is
probed. Implementations: eager torch, torch.compile, Liger-Kernel, cut-cross-entropy,
torch's own ``F.linear_cross_entropy`` (chunked, skipped with its reason where the
installed torch lacks it), fusedce's default and each frontier point (:data:`FUSEDCE_POINTS`).

Cases run in :data:`CASES` order (most important first) until ``--budget-s`` seconds have
passed; the cells left are recorded as skipped ("out of time"), so a run always ends with a
complete account. Written as the run goes (a cut run keeps what it measured):

- ``<out>/frontier.jsonl``: one line per GEMM probe and per cell (profiler cell records,
  plus the case's label and ``x_floor``, peak extra over the gradient floor), appended when
  measured;
- ``<out>/frontier.json`` and ``.md``: the same cells as a :class:`benchmarks.results.BenchRun`
  (``benchmarks/render.py`` renders it; the environment is inside);
- ``<out>/environment.json``: versions, GPU, driver, commit.

    python3 benchmarks/frontier.py --out DIR                  # the H200 run (benchmarks/device/frontier.sh)
    python3 benchmarks/frontier.py --out DIR --dry            # CPU, tiny shapes: the code path only

Exit status 0; 2 on bad arguments, an existing output file, or ``cuda`` without a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.frontier_goals import verdict, verdict_lines
from benchmarks.impls import backend_for
from benchmarks.measure import measure_cell, measure_gemm
from benchmarks.protocol import MODES, Row, floor_bytes, make_inputs
from benchmarks.render import fmt_error, fmt_ms, render_markdown
from benchmarks.results import BenchRun, BenchSettings, collect_environment, save_run
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.backends import Backend, options_of
from fusedce_profiler.instrument.backends.fusedce_backends import FusedceBackend
from fusedce_profiler.instrument.protocol import settle
from fusedce_profiler.instrument.records import CellResult, CellSpec
from fusedce_profiler.instrument.reference import reference as fp32_reference


@dataclass(frozen=True)
class Case:
    """One (row, mode, options) group of cells; ``label`` names the model the head is from."""

    row: Row
    mode: str  # command-line mode: "amp" or "bf16"
    label: str
    softcap: float | None = None
    bias: bool = False



CASES = (
    Case(Row(8192, 4096, 128256, "Llama-3-8B head"), "bf16", "Llama-3-8B"),
    Case(Row(8192, 4096, 128256, "Llama-3-8B head"), "amp", "Llama-3-8B"),
    Case(Row(8192, 768, 32777, "the user's model"), "amp", "user"),
    Case(Row(8192, 768, 32777, "the user's model"), "bf16", "user"),
    Case(Row(8192, 2304, 256000, "Gemma-2-2B head"), "amp", "Gemma-2-2B"),
    Case(Row(8192, 2304, 256000, "Gemma-2-2B head"), "bf16", "Gemma-2-2B"),
    Case(Row(32768, 4096, 128256), "bf16", "Llama-3-8B, 32k tokens"),
    Case(Row(32768, 4096, 128256), "amp", "Llama-3-8B, 32k tokens"),
    Case(Row(16384, 3584, 152064, "Qwen2.5-7B head"), "amp", "Qwen2.5-7B"),
    Case(Row(8192, 2304, 256000, "Gemma-2-2B head"), "amp", "Gemma-2-2B, soft-cap 30", softcap=30.0),
    Case(Row(8192, 5120, 131072, "Mistral-NeMo head"), "bf16", "Mistral-NeMo, bias", bias=True),
)
"""The H200 run, most important first: the ANCHORS rows, then the extra heads of the goals."""

DRY_CASES = (
    Case(Row(96, 32, 1000), "bf16", "tiny"),
    Case(Row(64, 24, 517), "amp", "tiny, soft-cap 30", softcap=30.0),
    Case(Row(80, 40, 777), "bf16", "tiny, bias", bias=True),
)
"""``--dry``: the same code path at CPU sizes (ragged V, soft-cap, bias)."""

FUSEDCE_POINTS = {
    "fusedce_precompute": {"strategy": "precompute"},
    "fusedce_fast_recompute": {"memory_budget": "fast", "strategy": "recompute"},
    "fusedce_fast_per_chunk": {"memory_budget": "fast", "grad_weight_accumulation": "per_chunk"},
    "fusedce_min_per_chunk": {"memory_budget": "min", "grad_weight_accumulation": "per_chunk"},
    "fusedce_x1_25": {"memory_budget": 1.25},
    "fusedce_x1_1": {"memory_budget": 1.1},
    "fusedce_x1_08": {"memory_budget": 1.08},
}
"""fusedce's explicit points beside ``fusedce`` / ``fusedce_min`` / ``fusedce_fast``:
gradients in forward by name (at least 1024 rows a chunk, whatever the default budget), the fast
budget recomputing by name (nothing kept from the forward: its bytes go to wider blocks), and
(bf16 weight only) the fast and the min budget with grad_W rounded into bf16 once per row chunk — without
that policy a bf16 weight's precompute needs a V×H fp32 accumulator, which "fast" does not
hold at H=4096, so ``fusedce_fast`` recomputes there (keeping the logits of part of the vocabulary, in bf16).
``fusedce_x1_25`` asks for a peak of 1.25 × floor, the default's memory goal: at small heads the default's
fixed 96 MiB of blocks exceeds it, and this point measures what meeting it costs in time. ``fusedce_x1_1`` and
``fusedce_x1_08`` ask for 1.1 and 1.08 × floor: in bf16 at the large heads, budgets below the default's
one pass and above "min"'s, where a budget in numbers splits the backward (``fusedce/split_plan.py``)."""

IMPLS = ("fusedce", "torch_compile", "fusedce_fast", "fusedce_min", "fusedce_precompute", "fusedce_fast_recompute",
         "fusedce_fast_per_chunk", "fusedce_min_per_chunk", "fusedce_x1_25", "fusedce_x1_1", "fusedce_x1_08", "liger",
         "cce", "torch", "torch_native")
"""Measuring order within a case: fusedce and its yardstick first, so a cut run has them."""

DRY_IMPLS = ("fusedce", "torch_compile", "fusedce_fast", "fusedce_min", "fusedce_precompute", "fusedce_fast_recompute",
             "fusedce_fast_per_chunk", "fusedce_min_per_chunk", "fusedce_x1_25", "fusedce_x1_1", "fusedce_x1_08",
             "liger", "torch", "torch_native")
"""``--dry``: liger shows the CUDA-only skip; cce is left out (same path)."""


def implementation(name: str) -> Backend:
    """The back-end measured under the benchmark name ``name``."""
    if name in FUSEDCE_POINTS:
        return FusedceBackend(name, **FUSEDCE_POINTS[name])
    return backend_for(name)


def _skip_reason(name: str, case: Case) -> str | None:
    if name in ("fusedce_fast_per_chunk", "fusedce_min_per_chunk") and case.mode != "bf16":
        return "per-chunk grad_W rounding applies to a bf16 weight only"
    return None


def cell_spec(case: Case, name: str, device: str, seed: int = 0) -> CellSpec:
    row = case.row
    return CellSpec(backend=name, tokens=row.tokens, vocab=row.vocab, hidden=row.hidden, mode=MODES[case.mode],
                    device=device, bias=case.bias, softcap=case.softcap, seed=seed)


def _line(cell: CellResult, floor: int) -> str:
    s = cell.spec
    what = f"{s.tokens}x{s.hidden}x{s.vocab} {s.mode:8} {s.backend:19}"
    if cell.status != "ok":
        return f"{what} {cell.status}: {cell.message}"
    peak = cell.peak_step_bytes
    memory = f"{peak / 2**30:7.3f} GiB {peak / floor:5.2f}x" if peak is not None else "      – GiB      "
    return (f"{what} {memory} {fmt_ms(cell.time_ms):>7} ms  warm-up {cell.extra.get('warmup_ms', 0) / 1e3:5.1f} s  "
            f"err h {fmt_error(cell.parity.grad_hidden)} W {fmt_error(cell.parity.grad_weight)}")


def keys_of(case: Case, impls: tuple[str, ...], device: str, seed: int = 0) -> set[str]:
    """The cell keys of ``case``: its cells among a run's."""
    return {cell_spec(case, name, device, seed).key() for name in impls}


def judge_case(case: Case, cells: list[CellResult], floor: int, jsonl: Path, log: Callable[[str], None]) -> None:
    """Print who dominates whom and goals 1–5 for one case; append them as a ``goals`` line."""
    result = verdict(cells, floor=floor, hidden=case.row.hidden, mode=case.mode)
    store.append_jsonl(jsonl, {"kind": "goals", "case": case.label, "mode": case.mode, "shape": case.row.shape,
                               "dominated_by": {k: list(v) for k, v in result.dominated_by.items()},
                               "goals": {str(k): v for k, v in result.goals.items()},
                               "why": {str(k): v for k, v in result.why.items()}})
    for line in verdict_lines(f"{case.label} {case.row.shape} {case.mode}", result):
        log(line)


def run_frontier(out: Path, *, device: str, cases: tuple[Case, ...], impls: tuple[str, ...], repeats: int,
                 budget_s: float, seed: int = 0, log: Callable[[str], None] = print) -> BenchRun:
    """Measure ``cases`` × ``impls`` until ``budget_s`` has passed (the rest: skipped), on the
    inputs :func:`benchmarks.protocol.make_inputs` draws from ``seed``."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device (use --dry for a CPU run)")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("frontier.jsonl", "frontier.json", "frontier.md", "environment.json")}
    for path in paths.values():
        if path.exists():
            raise FileExistsError(f"{path} exists (choose an empty --out)")
    settings = BenchSettings(rows=list(dict.fromkeys(c.row.shape for c in cases)),
                             modes=list(dict.fromkeys(c.mode for c in cases)), impls=list(impls), device=device,
                             repeats=repeats, seed=seed, tag="frontier")
    run = BenchRun(collect_environment(device), settings)
    store.write_json(paths["environment.json"], dataclasses.asdict(run.environment))

    def record(cell: CellResult, floor: int, case: Case) -> None:
        run.cells.append(cell)
        peak = cell.peak_step_bytes
        store.append_jsonl(paths["frontier.jsonl"], {"kind": "cell", "case": case.label, **cell.to_dict(),
                                                     "x_floor": None if peak is None else peak / floor})
        run.wall_s = time.perf_counter() - started
        save_run(run, paths["frontier.json"])
        store.write_text(paths["frontier.md"], render_markdown(run))
        log(_line(cell, floor))

    for case in cases:
        row, mode = case.row, MODES[case.mode]
        floor = floor_bytes(row, mode, bias=case.bias)
        if time.perf_counter() - started > budget_s:
            for name in impls:
                record(CellResult(cell_spec(case, name, device, seed), "skipped", message="out of time"), floor, case)
            continue
        if row not in run.rows:
            run.rows.append(row)
            rate = measure_gemm(row, device=device, repeats=repeats)
            run.gemm.append(rate)
            store.append_jsonl(paths["frontier.jsonl"], {"kind": "gemm", **dataclasses.asdict(rate)})
            log(f"{row.shape} bf16 GEMM: {rate.tflops:.0f} TFLOP/s" if rate.tflops else f"{row.shape}: {rate.message}")
        base = cell_spec(case, "", device, seed)
        inputs = make_inputs(row, mode, device=device, bias=case.bias, seed=seed)
        reference = fp32_reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options_of(base))
        for name in impls:
            spec = dataclasses.replace(base, backend=name)
            reason = _skip_reason(name, case)
            if reason is None and time.perf_counter() - started > budget_s:
                reason = "out of time"
            if reason is not None:
                record(CellResult(spec, "skipped", message=reason), floor, case)
                continue
            record(measure_cell(implementation(name), spec, inputs, reference, repeats=repeats), floor, case)
        del inputs, reference
        settle(device)
        judge_case(case, [cell for cell in run.cells if cell.spec.key() in keys_of(case, impls, device, seed)], floor,
                   paths["frontier.jsonl"], log)
    run.wall_s = time.perf_counter() - started
    save_run(run, paths["frontier.json"])
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The time–memory frontier of LM-head losses on one GPU.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="an empty folder for the results")
    parser.add_argument("--dry", action="store_true", help="CPU, tiny shapes: check the code path, measure nothing")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell (median), at least 5 on a GPU")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds after which the cases left are recorded as skipped")
    parser.add_argument("--impls", nargs="+", metavar="NAME", help=f"only these (of {', '.join(IMPLS)})")
    parser.add_argument("--mode", choices=("amp", "bf16"), help="only the cases of this mode")
    parser.add_argument("--cases", nargs="+", metavar="LABEL", help="only the cases of these labels")
    parser.add_argument("--seed", type=int, default=0, help="the seed the inputs are drawn from")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < (1 if args.dry else 5):
        print(f"frontier: --repeats must be at least {1 if args.dry else 5}, got {args.repeats}", file=sys.stderr)
        return 2
    if not 0 <= args.seed < 2 ** 63:
        print(f"frontier: --seed must be in [0, 2**63), got {args.seed}", file=sys.stderr)
        return 2
    if not args.budget_s > 0:
        print(f"frontier: --budget-s must be a positive number of seconds, got {args.budget_s}", file=sys.stderr)
        return 2
    device, cases, impls = ("cpu", DRY_CASES, DRY_IMPLS) if args.dry else ("cuda", CASES, IMPLS)
    if args.mode:
        cases = tuple(case for case in cases if case.mode == args.mode)
    for option, wanted, known in (("--impls", args.impls, impls), ("--cases", args.cases,
                                                                    tuple(dict.fromkeys(c.label for c in cases)))):
        unknown = sorted(set(wanted or ()) - set(known))
        if unknown:
            print(f"frontier: {option}: unknown {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
            return 2
    if args.impls:
        impls = tuple(name for name in impls if name in args.impls)
    if args.cases:
        cases = tuple(case for case in cases if case.label in args.cases)
    try:
        run = run_frontier(args.out, device=device, cases=cases, impls=impls, repeats=args.repeats,
                           budget_s=args.budget_s, seed=args.seed, log=lambda line: print(line, flush=True))
    except (FileExistsError, ValueError) as exc:
        print(f"frontier: {exc}", file=sys.stderr)
        return 2
    done = sum(cell.status == "ok" for cell in run.cells)
    print(f"\n{done} of {len(run.cells)} cells measured in {run.wall_s:.0f} s; wrote {args.out}/frontier.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
