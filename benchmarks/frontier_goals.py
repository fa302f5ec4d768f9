"""Who dominates whom in one case of the frontier run, and the fused loss's goals 1–5 there.

A case is one (row, mode, options) group of cells measured side by side (:mod:`benchmarks.frontier`).
A point *dominates* another when it holds no more memory, is no slower, and is better on one of the
two (:func:`fusedce_reports.frontier.dominates`, medians of CUDA-event timings). The goals, for
fusedce's three named points (``fusedce`` = the default, ``fusedce_fast``, ``fusedce_min``):

1. no named point is dominated by a peer (:data:`PEERS`), and each has gradient errors ≤ eager's;
2. default: peak ≤ 1.25 × floor, time ≤ 1.3 × torch.compile's at H ≥ 2048, ≤ 1.6 × below;
3. ``"fast"``: no slower than torch.compile at no more than its memory, strictly better on one;
4. ``"min"``: ≤ 1.05 × floor, and ≤ 1.5 × the default's time;
5. bf16: the default is not dominated by Liger.

A goal is ``None`` when a cell it needs did not run. Pure functions of the cells; run as a
script on a run's ``frontier.jsonl`` it prints them again, and the markdown table of the case's
named points beside the peers::

    python3 benchmarks/frontier_goals.py benchmarks/results/<run>/frontier.jsonl
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.protocol import MODES, Row, floor_bytes
from fusedce_profiler.instrument.records import CellResult
from fusedce_reports.frontier import dominates
from fusedce_reports.timing import Timing

NAMED = {"fusedce": "default", "fusedce_fast": "fast", "fusedce_min": "min"}
PEERS = ("torch_compile", "liger", "cce", "torch_native")
GRADIENTS = ("grad_hidden", "grad_weight", "grad_bias")
DEFAULT_FLOOR_FACTOR = 1.25
DEFAULT_TIME_FACTOR_WIDE, DEFAULT_TIME_FACTOR_NARROW, WIDE_HIDDEN = 1.3, 1.6, 2048
MIN_FLOOR_FACTOR, MIN_TIME_FACTOR = 1.05, 1.5


@dataclass(frozen=True)
class CaseVerdict:
    """One case: ``dominated_by`` maps each measured back-end to those dominating it; ``goals``
    maps 1–5 to met (True), missed (False) or not checkable (None); ``why`` one line per goal."""

    dominated_by: dict[str, tuple[str, ...]]
    goals: dict[int, bool | None]
    why: dict[int, str] = field(default_factory=dict)


def _point(cell: CellResult) -> tuple[float, Timing]:
    return float(cell.peak_step_bytes), Timing(cell.time_ms, None, None, False)


def domination(cells: list[CellResult]) -> dict[str, tuple[str, ...]]:
    """For every cell that ran with a peak and a time: the back-ends that dominate it."""
    measured = {c.spec.backend: c for c in cells
                if c.status == "ok" and c.peak_step_bytes is not None and c.time_ms is not None}
    return {name: tuple(other for other in measured
                        if other != name and dominates(_point(measured[other]), _point(cell)))
            for name, cell in measured.items()}


def _parity_within_eager(cell: CellResult, eager: CellResult | None) -> bool | None:
    if eager is None:
        return None
    pairs = [(getattr(cell.parity, g), getattr(eager.parity, g)) for g in GRADIENTS
             if getattr(eager.parity, g) is not None]
    return all(ours is not None and ours <= theirs for ours, theirs in pairs) if pairs else None


def verdict(cells: list[CellResult], *, floor: int, hidden: int, mode: str) -> CaseVerdict:
    """Domination and goals 1–5 for one case's ``cells``; ``floor``: bytes of the gradients
    (:func:`benchmarks.protocol.floor_bytes`); ``mode``: "amp" or "bf16"."""
    ok = {c.spec.backend: c for c in cells if c.status == "ok" and c.time_ms is not None}
    beaten = domination(cells)
    goals: dict[int, bool | None] = {}
    why: dict[int, str] = {}

    named = [name for name in NAMED if name in ok]
    if not named:
        return CaseVerdict(beaten, {g: None for g in range(1, 6)}, {g: "no fusedce point ran" for g in range(1, 6)})
    eager = ok.get("torch")
    lost = {name: [p for p in beaten.get(name, ()) if p in PEERS] for name in named}
    parity = {name: _parity_within_eager(ok[name], eager) for name in named}
    goals[1] = not any(lost.values()) and all(p is not False for p in parity.values())

    def peer(name: str) -> str:  # a peer that wins with errors above eager's is marked so
        return name + (" (errors above eager's)" if _parity_within_eager(ok[name], eager) is False else "")

    why[1] = "; ".join(f"{NAMED[n]}: " + (f"dominated by {', '.join(map(peer, lost[n]))}" if lost[n] else "undominated")
                       + ("" if parity[n] is not False else ", errors above eager's") for n in named)

    compiled, default = ok.get("torch_compile"), ok.get("fusedce")
    if default is not None and compiled is not None:
        x_floor = default.peak_step_bytes / floor
        limit = DEFAULT_TIME_FACTOR_WIDE if hidden >= WIDE_HIDDEN else DEFAULT_TIME_FACTOR_NARROW
        ratio = default.time_ms / compiled.time_ms
        goals[2] = x_floor <= DEFAULT_FLOOR_FACTOR and ratio <= limit
        why[2] = f"{x_floor:.2f}× floor (≤ {DEFAULT_FLOOR_FACTOR}), {ratio:.2f}× torch.compile (≤ {limit})"
    else:
        goals[2], why[2] = None, "default or torch.compile missing"

    fast = ok.get("fusedce_fast")
    if fast is not None and compiled is not None:
        no_worse = fast.time_ms <= compiled.time_ms and fast.peak_step_bytes <= compiled.peak_step_bytes
        better = fast.time_ms < compiled.time_ms or fast.peak_step_bytes < compiled.peak_step_bytes
        goals[3] = no_worse and better
        why[3] = (f"{fast.time_ms / compiled.time_ms:.2f}× torch.compile's time, "
                  f"{fast.peak_step_bytes / compiled.peak_step_bytes:.2f}× its memory")
    else:
        goals[3], why[3] = None, "fast or torch.compile missing"

    small = ok.get("fusedce_min")
    if small is not None and default is not None:
        x_floor = small.peak_step_bytes / floor
        ratio = small.time_ms / default.time_ms
        goals[4] = x_floor <= MIN_FLOOR_FACTOR and ratio <= MIN_TIME_FACTOR
        why[4] = f"{x_floor:.3f}× floor (≤ {MIN_FLOOR_FACTOR}), {ratio:.2f}× the default's time (≤ {MIN_TIME_FACTOR})"
    else:
        goals[4], why[4] = None, "min or default missing"

    if mode != "bf16":
        goals[5], why[5] = None, "amp (the goal is for bf16)"
    elif default is None or "liger" not in ok:
        goals[5], why[5] = None, "default or Liger missing"
    else:
        goals[5] = "liger" not in beaten.get("fusedce", ())
        liger = ok["liger"]
        why[5] = (f"default {default.peak_step_bytes / 2**30:.3f} GiB / {default.time_ms:.1f} ms, "
                  f"Liger {liger.peak_step_bytes / 2**30:.3f} GiB / {liger.time_ms:.1f} ms")
    return CaseVerdict(beaten, goals, why)


def verdict_lines(title: str, result: CaseVerdict) -> list[str]:
    """The printed account of one case: each dominated back-end, then each goal."""
    lines = [f"== {title}"]
    for name, winners in result.dominated_by.items():
        lines.append(f"   {name:22} " + (f"dominated by {', '.join(winners)}" if winners else "on the frontier"))
    for goal in range(1, 6):
        met = result.goals.get(goal)
        mark = "met" if met else ("–" if met is None else "MISSED")
        lines.append(f"   goal {goal}: {mark:6} {result.why.get(goal, '')}")
    return lines


TABLE_BACKENDS = ("torch_compile", "liger", "cce", "fusedce", "fusedce_fast", "fusedce_min")


def read_cases(jsonl: Path) -> dict[tuple[str, str], list[CellResult]]:
    """The cells of a ``frontier.jsonl`` by case: (label, stored mode) → its cells, in run order."""
    cases: dict[tuple[str, str], list[CellResult]] = {}
    for line in jsonl.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "cell":
            cases.setdefault((record["case"], record["spec"]["mode"]), []).append(CellResult.from_dict(record))
    return cases


def judge_run(jsonl: Path) -> tuple[list[str], list[str]]:
    """(printed verdicts, markdown table rows) for every case of a ``frontier.jsonl``, in run order.

    Table cells: peak extra as × the floor · median ms; the last column marks goals 1–5
    (✓ met, ✗ missed, · not checkable)."""
    cases = read_cases(jsonl)
    lines, table = [], ["| case | mode | " + " | ".join(TABLE_BACKENDS) + " | goals 1–5 |",
                        "|" + "---|" * (len(TABLE_BACKENDS) + 3)]
    for (label, stored_mode), cells in cases.items():
        mode = next(name for name, value in MODES.items() if value == stored_mode)
        spec = cells[0].spec
        row = Row(spec.tokens, spec.hidden, spec.vocab)
        floor = floor_bytes(row, stored_mode, bias=spec.bias)
        result = verdict(cells, floor=floor, hidden=spec.hidden, mode=mode)
        lines += verdict_lines(f"{label} {row.shape} {mode}", result)
        ok = {c.spec.backend: c for c in cells if c.status == "ok" and c.peak_step_bytes is not None}
        shown = [f"{ok[b].peak_step_bytes / floor:.2f}× · {ok[b].time_ms:.1f}" if b in ok else "–"
                 for b in TABLE_BACKENDS]
        marks = "".join("·" if result.goals[g] is None else "✓" if result.goals[g] else "✗" for g in range(1, 6))
        table.append(f"| {label} {row.shape} | {mode} | " + " | ".join(shown) + f" | {marks} |")
    return lines, table


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        print("usage: frontier_goals.py RUN/frontier.jsonl", file=sys.stderr)
        sys.exit(2)
    verdicts, rows = judge_run(Path(sys.argv[1]))
    print("\n".join(verdicts + [""] + rows))
