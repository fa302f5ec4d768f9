"""Hand-made grid results for the report tests: one call per cell, every field explicit.

``cell("fusedce", 2048, peak_mib=12, time_ms=3.0)`` is a finished cell on a small head
(H=64, V=1000, amp-bf16, CUDA); ``cpu=True`` makes it a CPU-profiler cell; ``spread``
gives its min–max time range; ``err`` its relative errors (0.2 fails amp-bf16's 3e-2).
"""
from __future__ import annotations

from fusedce_profiler.instrument.records import CellResult, CellSpec, Parity
from fusedce_reports import results_frame

MIB = 1 << 20


def cell(backend: str, tokens: int, peak_mib: float | None = 10.0, *, status: str = "ok", time_ms: float = 1.0,
         spread: tuple[float, float] | None = None, err: float = 1e-3, hidden: int = 64, vocab: int = 1000,
         mode: str = "amp-bf16", cpu: bool = False, message: str = "", floor_mib: float = 1.0,
         oom_mib: float | None = None) -> CellResult:
    spec = CellSpec(backend, tokens, vocab, hidden, mode=mode, device="cpu" if cpu else "cuda")
    ran = status == "ok"
    low, high = spread if spread is not None else (time_ms, time_ms)
    return CellResult(
        spec, status=status, message=message, memory_source="cpu-profiler" if cpu else "cuda-allocator",
        peak_step_bytes=int(peak_mib * MIB) if ran and peak_mib is not None else None,
        floor_bytes=int(floor_mib * MIB), predicted_bytes=int(peak_mib * MIB) if ran and peak_mib else None,
        oom_requested_bytes=int(oom_mib * MIB) if oom_mib is not None else None,
        time_ms=time_ms if ran else None, time_ms_min=low if ran else None, time_ms_max=high if ran else None,
        parity=Parity(loss=err, grad_hidden=err, grad_weight=err) if ran else Parity())


def frame(*cells: CellResult):
    """The results frame of ``cells`` (:func:`fusedce_reports.results_frame`)."""
    return results_frame(list(cells))
