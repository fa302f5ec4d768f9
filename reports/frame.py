"""The results file as one pandas DataFrame, one row per cell, with derived columns.

Every table, finding and plot reads this frame; nothing else parses ``results.jsonl``.

Columns (bytes are integers or NaN, times milliseconds, errors relative):

=====================  ===========================================================
``backend``             back-end name (``torch``, ``fusedce``, ``module:callable`` …)
``mode`` ``device``     precision mode (``amp-bf16`` …) and ``cuda`` / ``cpu``
``tokens`` ``hidden``   N = B·T, H and V of the cell
``vocab``
``head``                ``H×V`` label, e.g. ``768×32777``
``options``             the non-default loss options, e.g. ``bias, ignore 30%``; ``""``
``group``               the cell's spec without its back-end: cells with equal
                        ``group`` measured the same problem with different back-ends
``status`` ``message``  ``ok`` / ``oom`` / ``error`` / ``skipped`` and why
``memory_source``       ``cuda-allocator`` or ``cpu-profiler``
``peak_bytes``          peak extra over the whole step (forward + backward)
``peak_forward_bytes``  peak extra during forward / during backward
``peak_backward_bytes``
``reserved_bytes``      caching allocator's peak reserved (CUDA only)
``floor_bytes``         bytes of the gradients that must exist at the end
``predicted_bytes``     the analytic model's prediction of ``peak_bytes``
``oom_requested_bytes`` the allocation that failed (``oom`` cells)
``x_floor``             ``peak_bytes / floor_bytes``
``predicted_error``     ``(peak_bytes − predicted_bytes) / predicted_bytes``
``logits_bytes``        N·V·(bytes of the compute dtype): one copy of the logits
``torch_peak_bytes``    ``peak_bytes`` of the ``torch`` back-end in the same group
``saving_bytes``        ``torch_peak_bytes − peak_bytes``
``saving_frac``         ``saving_bytes / torch_peak_bytes``
``time_ms``             median forward+backward; ``time_ms_min`` / ``time_ms_max``
``err_loss``            relative errors vs the fp32 reference
``err_grad_hidden``
``err_grad_weight``
``err_grad_bias``
``worst_error``         the largest of the errors above (infinite when one is NaN: a
                        loss or gradient that is not finite); ``tolerance`` of the mode
``non_finite``          True when the loss or a gradient was not finite (NaN errors)
``parity_ok``           True / False / None (no errors reported)
``backend_version``     version string of the back-end
``snapshot_path``       memory snapshot of the cell, relative to the run folder
``timeline_path``       its timeline (JSON), which the report draws
``log_path``            the worker log holding an ``error``/``timeout`` cell's traceback
=====================  ===========================================================
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fusedce_profiler.instrument.precision import dtype_bytes, precision
from fusedce_profiler.instrument.records import CellResult, CellSpec
from fusedce_reports.palette import backend_rank
from fusedce_profiler.instrument.tolerances import parity_verdict

BASELINE_BACKEND = "torch"
"""Savings are measured against this back-end: the loss exactly as users write it."""

def options_label(spec: CellSpec) -> str:
    """The loss options that differ from the defaults, for table headings."""
    parts = []
    if spec.bias:
        parts.append("bias")
    if spec.ignore_frac:
        parts.append(f"ignore {100 * spec.ignore_frac:.0f}%")
    if spec.label_smoothing:
        parts.append(f"label smoothing {spec.label_smoothing:g}")
    if spec.z_loss:
        parts.append(f"z-loss {spec.z_loss:g}")
    if spec.softcap is not None:
        parts.append(f"softcap {spec.softcap:g}")
    if spec.reduction != "mean":
        parts.append(f"reduction {spec.reduction}")
    return ", ".join(parts)


def _row(result: CellResult) -> dict:
    spec = result.spec
    verdict = parity_verdict(result)
    non_finite = verdict.worst is not None and math.isnan(verdict.worst)
    return {
        "backend": spec.backend,
        "mode": spec.mode,
        "device": spec.device,
        "tokens": spec.tokens,
        "hidden": spec.hidden,
        "vocab": spec.vocab,
        "batch": spec.batch,
        "seq": spec.seq,
        "head": f"{spec.hidden}×{spec.vocab}",
        "options": options_label(spec),
        "group": spec.group_key(),
        "status": result.status,
        "message": result.message,
        "memory_source": result.memory_source,
        "peak_bytes": result.peak_step_bytes,
        "peak_forward_bytes": result.peak_forward_bytes,
        "peak_backward_bytes": result.peak_backward_bytes,
        "reserved_bytes": result.peak_reserved_bytes,
        "floor_bytes": result.floor_bytes,
        "predicted_bytes": result.predicted_bytes,
        "oom_requested_bytes": result.oom_requested_bytes,
        "logits_bytes": spec.tokens * spec.vocab * dtype_bytes(precision(spec.mode).compute),
        "time_ms": result.time_ms,
        "time_ms_min": result.time_ms_min,
        "time_ms_max": result.time_ms_max,
        "err_loss": result.parity.loss,
        "err_grad_hidden": result.parity.grad_hidden,
        "err_grad_weight": result.parity.grad_weight,
        "err_grad_bias": result.parity.grad_bias,
        "worst_error": math.inf if non_finite else verdict.worst,
        "non_finite": non_finite,
        "tolerance": verdict.tolerance,
        "parity_ok": verdict.passed,
        "backend_version": result.backend_version,
        "snapshot_path": result.snapshot_path,
        "timeline_path": result.timeline_path,
        "log_path": result.log_path,
    }


NUMERIC_COLUMNS = (
    "peak_bytes", "peak_forward_bytes", "peak_backward_bytes", "reserved_bytes", "floor_bytes",
    "predicted_bytes", "oom_requested_bytes", "time_ms", "time_ms_min", "time_ms_max",
    "err_loss", "err_grad_hidden", "err_grad_weight", "err_grad_bias", "worst_error",
)


def results_frame(results: Sequence[CellResult]) -> pd.DataFrame:
    """One row per cell (columns in the module docstring), sorted by group then tokens.

    When a cell was measured twice (a resumed run that re-ran it) the last row wins.
    """
    latest = {r.spec.key(): r for r in results}
    frame = pd.DataFrame([_row(r) for r in latest.values()])
    if frame.empty:
        return pd.DataFrame(columns=[*_row(CellResult(CellSpec("torch", 1, 1, 1))).keys(),
                                     "x_floor", "predicted_error", "torch_peak_bytes",
                                     "saving_bytes", "saving_frac"])
    for column in NUMERIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    ok = frame["status"] == "ok"
    peak = frame["peak_bytes"].where(ok)
    frame["x_floor"] = peak / frame["floor_bytes"]
    frame["predicted_error"] = (peak - frame["predicted_bytes"]) / frame["predicted_bytes"]

    baseline = frame[(frame["backend"] == BASELINE_BACKEND) & ok].set_index("group")["peak_bytes"]
    frame["torch_peak_bytes"] = frame["group"].map(baseline).astype(float)
    frame["saving_bytes"] = frame["torch_peak_bytes"] - peak
    frame["saving_frac"] = frame["saving_bytes"] / frame["torch_peak_bytes"]
    derived = ["x_floor", "predicted_error", "torch_peak_bytes", "saving_bytes", "saving_frac"]
    frame[derived] = frame[derived].replace([np.inf, -np.inf], np.nan)  # an infinite error stays one
    frame["_rank"] = frame["backend"].map(backend_rank)
    frame = frame.sort_values(
        ["device", "mode", "hidden", "vocab", "options", "tokens", "_rank"], kind="stable"
    )
    return frame.drop(columns="_rank").reset_index(drop=True)
