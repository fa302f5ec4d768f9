"""When one measured time may be called faster than another.

On a GPU a cell's time is the median of CUDA-event timings, stable enough to compare
medians. On the CPU (``memory_source == "cpu-profiler"``) wall-clock times of small steps
vary from call to call and with the machine's other load, so a back-end is faster only
when its slowest call beat the other's fastest: their min–max ranges do not overlap. A CPU
cell without a recorded range is never called faster.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fusedce_reports.units import is_missing

CPU_SOURCE = "cpu-profiler"


@dataclass(frozen=True)
class Timing:
    """One cell's time: ``median_ms`` and its ``low_ms``–``high_ms`` range (``None`` when not
    recorded); ``noisy`` when it is a CPU wall-clock time, compared by its range."""

    median_ms: float
    low_ms: float | None
    high_ms: float | None
    noisy: bool

    @classmethod
    def of(cls, row: pd.Series) -> "Timing":
        """The timing of a results-frame row (columns ``time_ms``, ``time_ms_min``, ``time_ms_max``)."""
        low, high = row["time_ms_min"], row["time_ms_max"]
        return cls(float(row["time_ms"]), None if is_missing(low) else float(low),
                   None if is_missing(high) else float(high), row["memory_source"] == CPU_SOURCE)


def faster(a: Timing, b: Timing) -> bool:
    """True when ``a`` is measurably faster than ``b``: a lower median on a GPU; on the CPU,
    ``a``'s slowest call faster than ``b``'s fastest."""
    if a.noisy or b.noisy:
        return a.high_ms is not None and b.low_ms is not None and a.high_ms < b.low_ms
    return a.median_ms < b.median_ms
