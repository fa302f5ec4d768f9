"""The measured attribution of a training step's peak, as tables and sentences.

Of results that carry an :class:`~fusedce_profiler.instrument.tracing.trace.Attribution` (a traced step): the peak by
kind (:func:`attribution_table`), the logits detector's tensors (:func:`detector_table`),
and the activations at the peak in words (:func:`activation_split`, :func:`largest_term`).
The model report (:mod:`fusedce_reports.model_report`) and the recorded report
(:mod:`fusedce_reports.recorded_report`) render them; the bars are :mod:`fusedce_reports.plots.model`.
"""
from __future__ import annotations

import pandas as pd

from fusedce_profiler.instrument.step.jobs import ModelResult
from fusedce_profiler.instrument.tracing.attribution import ACTIVATION_KINDS, KINDS, OPTIMIZER_KINDS, Attribution
from fusedce_reports.units import format_bytes, format_percent


def traced_results(results: list[ModelResult]) -> list[ModelResult]:
    """The results that ran and were traced (they carry an :class:`~fusedce_profiler.instrument.tracing.trace.Attribution`)."""
    return [r for r in results if r.status == "ok" and r.attribution is not None]


def attribution_table(results: list[ModelResult]) -> pd.DataFrame:
    """One row per traced result: its peak by kind (columns), the traced and the metered peak."""
    rows = []
    for r in traced_results(results):
        a = r.attribution
        row = {"back-end": r.job.label}
        for kind in KINDS:
            value = a.kind_bytes(kind)
            row[kind] = format_bytes(value) if value else "–"
        row["traced peak"] = format_bytes(a.peak_bytes)
        row["metered peak"] = format_bytes(a.metered_peak_bytes) if a.metered_peak_bytes else "–"
        row["gap"] = f"{a.relative_gap:+.1%}" if a.relative_gap is not None else "–"
        rows.append(row)
    frame = pd.DataFrame(rows)
    if not frame.empty:  # drop kinds that are empty in every row
        frame = frame[[c for c in frame.columns if not (frame[c] == "–").all() or c in ("back-end",)]]
    return frame


def detector_table(results: list[ModelResult]) -> pd.DataFrame:
    """The logits detector's tensors per back-end (the largest few)."""
    rows = []
    for r in traced_results(results):
        for t in r.attribution.large_tensors[:4]:
            rows.append({"back-end": r.job.label, "bytes": format_bytes(t.bytes),
                         "dtype": t.dtype + (" (bytes ÷ N·V)" if t.dtype_from != "shape" else ""),
                         "shape": "×".join(map(str, t.shape)) if t.shape else "–", "op": t.op, "module": t.module,
                         "source": t.source, "kept for backward": "yes" if t.kept_for_backward else "no",
                         "alive at peak": "yes" if t.alive_at_peak else "no"})
    return pd.DataFrame(rows)


def activation_split(attribution: Attribution, top: int = 4) -> str:
    """The activation kinds alive at the peak, largest first, with their shares of the peak:
    ``"attention scores/probabilities 6.00 GiB (48%), MLP 2.00 GiB (16%), …"``."""
    acts = sorted((k for k in attribution.kinds if k.kind in ACTIVATION_KINDS and k.bytes > 0),
                  key=lambda k: -k.bytes)
    if not acts:
        return "none (nothing was alive at the peak beyond parameters, gradients and optimizer state)"
    peak = attribution.peak_bytes or 1
    shown = [f"{k.kind} {format_bytes(k.bytes)} ({format_percent(k.bytes / peak)})" for k in acts[:top]]
    rest = sum(k.bytes for k in acts[top:])
    if rest:
        shown.append(f"the other {len(acts) - top} kinds {format_bytes(rest)} ({format_percent(rest / peak)})")
    return ", ".join(shown)


def largest_term(attribution: Attribution) -> str:
    """The largest kind the step itself allocated (an activation kind or the optimizer's
    temporaries) alive at the peak, in plain words with its measured numbers."""
    acts = [k for k in attribution.kinds if k.kind in ACTIVATION_KINDS + OPTIMIZER_KINDS and k.bytes > 0]
    if not acts:
        return "no activations were alive at the peak"
    top = max(acts, key=lambda k: k.bytes)
    share = top.bytes / attribution.peak_bytes if attribution.peak_bytes else 0.0
    a = attribution
    if top.kind == "attention scores/probabilities" and a.heads and a.seq > 1:
        heads = max(a.heads)
        elements = a.batch * heads * a.seq * a.seq
        per = top.bytes / top.blocks if top.blocks else 0
        itemsize = per / elements if elements else 0
        dtype = {2: "bf16", 4: "fp32"}.get(round(itemsize), f"{itemsize:.1f}-byte")
        layers = f"{a.layers} layers, " if a.layers else ""
        return (f"attention scores/probabilities: {top.blocks} tensors ({layers}{top.blocks / max(a.layers, 1):.0f} "
                f"per layer) of B × heads × T × T = {a.batch} × {heads} × {a.seq} × {a.seq} in {dtype} "
                f"({format_bytes(per)} each) = {format_bytes(top.bytes)}, {format_percent(share)} of the peak")
    if top.kind in ("LM-head input/logits", "loss internals"):
        n_v = a.tokens * a.vocab
        return (f"{top.kind}: {format_bytes(top.bytes)} ({format_percent(share)} of the peak) in {top.blocks} "
                f"tensor(s), {top.bytes / n_v:.2g} bytes per logit of N × V = {a.tokens} × {a.vocab}")
    modules = [m.module for m in a.modules if m.kind == top.kind]
    where = f" (largest: {', '.join(modules[:3])})" if modules else ""
    if top.kind in OPTIMIZER_KINDS:
        where = " allocated inside the optimizer's step()"
    backward = f", {format_bytes(top.backward_bytes)} of it allocated in backward" if top.backward_bytes else ""
    return (f"{top.kind}: {format_bytes(top.bytes)} ({format_percent(share)} of the peak) in {top.blocks} tensors"
            f"{where}{backward}")
