"""Tables of cells: the formatted per-group tables of the summary, and ``results.csv``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fusedce_reports.frame import BASELINE_BACKEND
from fusedce_reports.units import format_bytes, format_error, format_ms, format_percent, format_tokens, is_missing

CELL_TABLE_COLUMNS = (
    "back-end", "tokens", "peak extra", "× floor", "predicted", "saving vs torch", "time", "parity", "status",
)

CSV_COLUMNS = (
    "backend", "mode", "device", "tokens", "hidden", "vocab", "batch", "seq", "options", "status",
    "memory_source", "peak_bytes", "peak_forward_bytes", "peak_backward_bytes", "reserved_bytes",
    "floor_bytes", "predicted_bytes", "oom_requested_bytes", "x_floor", "predicted_error",
    "logits_bytes", "torch_peak_bytes", "saving_bytes", "saving_frac", "time_ms", "time_ms_min",
    "time_ms_max", "err_loss", "err_grad_hidden", "err_grad_weight", "err_grad_bias", "worst_error",
    "tolerance", "parity_ok", "backend_version", "message",
)


@dataclass
class CellTable:
    """One group of comparable cells (same device, mode, head and options), formatted.

    ``title`` names the group (``768×32777 · amp-bf16 · cuda``); ``rows`` holds strings,
    columns :data:`CELL_TABLE_COLUMNS`, one row per cell, ordered by tokens then back-end.
    """

    title: str
    rows: pd.DataFrame


def _peak_text(row: pd.Series) -> str:
    if row["status"] == "oom":
        asked = row["oom_requested_bytes"]
        return "OOM" if is_missing(asked) else f"OOM (asked {format_bytes(asked)})"
    if row["status"] != "ok":
        return "–"
    return format_bytes(row["peak_bytes"])


def _saving_text(row: pd.Series, failed_baselines: dict[str, str]) -> str:
    if row["status"] != "ok":
        return "–"
    if row["backend"] == BASELINE_BACKEND:
        return "baseline"
    if is_missing(row["saving_bytes"]):
        return f"{BASELINE_BACKEND} {failed_baselines[row['group']]}" if row["group"] in failed_baselines else "–"
    return f"{format_bytes(row['saving_bytes'])} ({format_percent(row['saving_frac'])})"


def _parity_text(row: pd.Series) -> str:
    if row.get("non_finite", False):  # a NaN loss or gradient: a parity failure
        return f"NaN ✗ (tol {row['tolerance']:.0e})"
    if row["parity_ok"] is None or is_missing(row["worst_error"]):
        return "–"
    mark = "✓" if row["parity_ok"] else f"✗ (tol {row['tolerance']:.0e})"
    return f"{format_error(row['worst_error'])} {mark}"


def _status_text(row: pd.Series) -> str:
    if row["status"] in ("ok", "oom") or not row["message"]:
        return row["status"]
    text = f"{row['status']}: {row['message'].strip().splitlines()[0]}"  # the first line, whole
    log = row.get("log_path")
    if isinstance(log, str) and log and log not in text:
        text += f" (traceback in {log})"
    return text


def _format_rows(group: pd.DataFrame, failed_baselines: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({
        "back-end": group["backend"],
        "tokens": group["tokens"].map(format_tokens),
        "peak extra": group.apply(_peak_text, axis=1),
        "× floor": group["x_floor"].map(lambda x: "–" if is_missing(x) else f"{x:.2f}"),
        "predicted": group["predicted_bytes"].map(format_bytes),
        "saving vs torch": group.apply(_saving_text, axis=1, failed_baselines=failed_baselines),
        "time": group["time_ms"].map(format_ms),
        "parity": group.apply(_parity_text, axis=1),
        "status": group.apply(_status_text, axis=1),
    }, columns=list(CELL_TABLE_COLUMNS)).reset_index(drop=True)


def group_title(device: str, mode: str, hidden: int, vocab: int, options: str) -> str:
    """``H=768 V=32777 · amp-bf16 · cuda`` plus the options when there are any."""
    parts = [f"H={hidden} V={vocab}", mode, device]
    if options:
        parts.append(options)
    return " · ".join(parts)


def cell_tables(frame: pd.DataFrame) -> list[CellTable]:
    """The formatted tables, one per (device, mode, H, V, options) group."""
    baseline = frame[(frame["backend"] == BASELINE_BACKEND) & (frame["status"] != "ok")]
    failed_baselines = dict(zip(baseline["group"], baseline["status"]))
    tables = []
    keys = ["device", "mode", "hidden", "vocab", "options"]
    for (device, mode, hidden, vocab, options), group in frame.groupby(keys, sort=False):
        title = group_title(device, mode, int(hidden), int(vocab), options)
        tables.append(CellTable(title, _format_rows(group, failed_baselines)))
    return tables


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """Write the numeric results (columns :data:`CSV_COLUMNS`, raw units) to ``path``, streamed;
    a text cell a spreadsheet would evaluate is neutralised (:func:`spreadsheet_safe`)."""
    from fusedce_profiler.instrument import store

    table = frame.reindex(columns=list(CSV_COLUMNS))
    table = table.apply(lambda column: column if pd.api.types.is_numeric_dtype(column)
                        else column.map(spreadsheet_safe))

    return store.write_text_stream(path, lambda text: table.to_csv(text, index=False))


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""First characters that make a spreadsheet read a cell as a formula."""


def spreadsheet_safe(value):
    """``value``, with a text that a spreadsheet would evaluate (:data:`FORMULA_STARTS`) prefixed
    by an apostrophe, which spreadsheets read as "this is text"; other values unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
