"""The benchmark's goals, checked for every fusedce cell against the other cells of the same run.

For one (row, mode, options) group:

1. memory: fusedce's peak extra ≤ 1.10 × floor + 128 MiB;
2. time: fusedce's median time ≤ torch_compile's (stretch: ≥ 80% of the measured bf16
   GEMM rate on 6·N·H·V);
3. parity: every relative error of fusedce (loss, grad_hidden, grad_weight, grad_bias) ≤
   eager torch's.

A check is ``None`` when it cannot be made (the comparison cell did not run, or memory
was not measured); a fusedce cell that ran out of memory or failed meets none of them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchmarks.protocol import GEMM_STRETCH_FRACTION, Row, memory_goal_bytes, step_flops, tflops
from fusedce_profiler.instrument.records import CellResult, CellSpec

SUBJECT = "fusedce"


@dataclass(frozen=True)
class GoalCheck:
    """The outcome of goals 1–3 (and the speed stretch) for one fusedce cell."""

    spec: CellSpec
    memory: bool | None
    time: bool | None
    parity: bool | None
    gemm_stretch: bool | None

    def met(self) -> bool:
        """All three goals checked and met (the stretch is not required)."""
        return self.memory is True and self.time is True and self.parity is True


def group_key(spec: CellSpec) -> str:
    """Cells with equal keys differ only by implementation (they are compared with each other)."""
    return dataclasses.replace(spec, backend="").key()


def _peer(cells: list[CellResult], spec: CellSpec, backend: str) -> CellResult | None:
    key = group_key(spec)
    for cell in cells:
        if cell.spec.backend == backend and group_key(cell.spec) == key and cell.status == "ok":
            return cell
    return None


def _parity_ok(subject: CellResult, torch_cell: CellResult) -> bool | None:
    pairs = [(getattr(subject.parity, name), getattr(torch_cell.parity, name))
             for name in ("loss", "grad_hidden", "grad_weight", "grad_bias")]
    pairs = [(ours, theirs) for ours, theirs in pairs if theirs is not None]
    if not pairs:
        return None
    return all(ours is not None and ours <= theirs for ours, theirs in pairs)


def check_cell(subject: CellResult, cells: list[CellResult], gemm_tflops: float | None) -> GoalCheck:
    """Goals 1–3 for ``subject`` (a fusedce cell) against its peers in ``cells``."""
    spec = subject.spec
    if subject.status == "skipped":
        return GoalCheck(spec, None, None, None, None)
    if subject.status != "ok":
        return GoalCheck(spec, False, False, False, False)
    memory = None
    if subject.peak_step_bytes is not None and subject.floor_bytes is not None:
        memory = subject.peak_step_bytes <= memory_goal_bytes(subject.floor_bytes)
    compiled = _peer(cells, spec, "torch_compile")
    time = subject.time_ms <= compiled.time_ms if compiled is not None else None
    eager = _peer(cells, spec, "torch")
    parity = _parity_ok(subject, eager) if eager is not None else None
    stretch = None
    if gemm_tflops:
        achieved = tflops(step_flops(Row(spec.tokens, spec.hidden, spec.vocab)), subject.time_ms)
        stretch = achieved >= GEMM_STRETCH_FRACTION * gemm_tflops
    return GoalCheck(spec, memory, time, parity, stretch)


def check_goals(cells: list[CellResult], gemm_tflops: dict[tuple[int, int, int], float | None]) -> list[GoalCheck]:
    """One :class:`GoalCheck` per fusedce cell; ``gemm_tflops`` maps (N, H, V) to the GEMM rate."""
    return [check_cell(cell, cells, gemm_tflops.get((cell.spec.tokens, cell.spec.hidden, cell.spec.vocab)))
            for cell in cells if cell.spec.backend == SUBJECT]
