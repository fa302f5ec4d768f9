"""The measurement of one benchmark cell: the profiler's protocol, run side by side.

Per (row, mode, implementation), on inputs shared by all implementations of the row, the
implementation being a :class:`fusedce_profiler.instrument.backends.Backend` (its adapter is built fresh for
every cell: the lazy import, and for torch.compile a reset Dynamo cache), the cell is
measured by :func:`fusedce_profiler.grid.cell.measure_cell` — the protocol of ``shared/ANCHORS.md`` and
of every other figure in the project (:mod:`fusedce_profiler.instrument.protocol`): one warm-up (timed by the
wall clock, ``extra["warmup_ms"]``), the metered forward+backward (the ``.grad`` tensors
count), parity against the shared fp32 reference, and the median of ``repeats`` CUDA-event
timings. Failures are recorded in the cell and the memory they held is released, so the run
goes on. This module adds only the cuBLAS GEMM-rate probe, the yardstick of the speed goal.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.protocol import Row
from fusedce_profiler.instrument.backends import Backend
from fusedce_profiler.grid.cell import MeasureSettings
from fusedce_profiler.grid.cell import measure_cell as measure_profiler_cell
from fusedce_profiler.grid.inputs import CellInputs
from fusedce_profiler.instrument.protocol import settle, time_calls
from fusedce_profiler.instrument.records import CellResult, CellSpec
from fusedce_profiler.instrument.reference import Reference


def measure_cell(backend: Backend, spec: CellSpec, inputs: CellInputs, reference: Reference, *,
                 repeats: int = 5) -> CellResult:
    """Run the protocol for ``backend`` on the shared ``inputs``; never raises for its errors.

    ``spec.backend`` is the benchmark's name of the implementation (it goes into the
    results as is). A cell the back-end cannot run is "skipped" with its reason. Raises
    ``ValueError`` if ``spec.reduction`` is not "mean", the only reduction the protocol measures.
    """
    if spec.reduction != "mean":
        raise ValueError(f"the benchmark measures reduction='mean', got spec.reduction={spec.reduction!r}")
    return measure_profiler_cell(spec, MeasureSettings(warmup=1, repeats=repeats), backend=backend,
                                 inputs=inputs, reference=reference)


@dataclass
class GemmRate:
    """cuBLAS bf16 ``torch.mm`` of (N, H) by (H, V) (the logits GEMM's layout) at one row."""

    tokens: int
    hidden: int
    vocab: int
    time_ms: float | None = None
    tflops: float | None = None
    message: str = ""


def measure_gemm(row: Row, *, device: str, repeats: int = 5, seed: int = 0) -> GemmRate:
    """Median time and TFLOP/s of ``torch.mm(a, w.t(), out=...)`` on random bf16 operands."""
    result = GemmRate(row.tokens, row.hidden, row.vocab)
    try:
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn(row.tokens, row.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        w = torch.randn(row.vocab, row.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        out = torch.empty(row.tokens, row.vocab, device=device, dtype=torch.bfloat16)
        # Warm-up: cuBLAS heuristics and workspace, and ~0.3 s of work so that an idle GPU's
        # clocks have ramped up (two calls were not enough for the first, small row of the
        # 2026-12-02 runs: it measured 95 TFLOP/s).
        deadline = time.perf_counter() + 0.3
        torch.mm(a, w.t(), out=out)
        while device == "cuda" and time.perf_counter() < deadline:
            torch.mm(a, w.t(), out=out)
            torch.cuda.synchronize()
        times = time_calls(lambda: torch.mm(a, w.t(), out=out), repeats, device=device)
        result.time_ms = statistics.median(times)
        result.tflops = 2 * row.tokens * row.hidden * row.vocab / (result.time_ms * 1e-3) / 1e12
    except torch.OutOfMemoryError as exc:
        result.message = f"OutOfMemoryError: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        a = w = out = None
        settle(device)
    return result
