"""The ``explain`` report: ``summary.md`` from ``explain.json`` alone.

:func:`write_explain_report` renders what :mod:`fusedce_profiler.judgements.explain.records` stored: the
readings and what was stated, the conclusion, the consistent hypotheses and the ruled-out
ones with their numbers, the measurement that would separate those that remain, and the
calibration steps every prediction comes from.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument import store
from fusedce_profiler.judgements.explain.records import GIB, MIB, Explanation, Hypothesis, load_explanation
from fusedce_profiler.judgements.explain.verdict import calibration_misses
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import code_block, markdown_text
from fusedce_reports.markdown import markdown_table
from fusedce_reports.units import format_bytes


def _mib(value: float | None) -> str:
    return "–" if value is None else format_bytes(int(value))


def _reading(mib: float) -> str:
    """A reading as the user wrote it: ``22,785`` or ``3.2``."""
    return f"{mib:,.0f}" if mib >= 100 else f"{mib:g}"


def hypotheses_table(hypotheses: list[Hypothesis], limit: int) -> pd.DataFrame:
    rows = []
    for rank, h in enumerate(hypotheses[:limit], 1):
        f = h.family
        rows.append({
            "rank": rank, "B": h.batch, "T": f.seq, "attention": f.attention, "tied": "yes" if f.tied else "no",
            "checkpointing": "yes" if f.checkpointing else "no", "eval pass": "yes" if f.eval_step else "no",
            "fused path": "active" if h.fused_active else "NOT active",
            "predicted naive": _mib(h.predicted_naive), "predicted fused": _mib(h.predicted_fused),
            "measured naive": _mib(h.measured_naive), "measured fused": _mib(h.measured_fused),
            "verdict": "consistent" if h.consistent else "ruled out", "why": h.why,
        })
    return pd.DataFrame(rows)


def calibration_table(explanation: Explanation) -> pd.DataFrame:
    rows = []
    for c in explanation.calibrations:
        rows.append({"back-end": c.backend, "family": c.family.label(),
                     "measured": ", ".join(f"B={b}: {_mib(f) if f is not None else s}"
                                           for b, f, s in zip(c.batches, c.figures, c.statuses)),
                     "line (MiB)": (f"{c.intercept / MIB:,.0f} + {c.slope / MIB:,.1f}·B" if c.slope is not None
                                    else "not fitted")})
    return pd.DataFrame(rows)


def render_explain_markdown(e: Explanation, environment: dict | None = None) -> str:
    o = e.observation
    stated = [f"{k}={getattr(o, k)}" for k in ("batch", "seq", "attention", "tied", "checkpointing", "eval_step",
                                               "fused_active") if getattr(o, k) is not None]
    lines = [f"# fusedce-profile explain: {_reading(o.naive_mib)} → {_reading(o.fused_mib)} MiB on a {o.total_gib:g} GiB "
             "card",
             "",
             markdown_text(f"Model: {e.model}; precision {o.mode}; fused back-end {o.fused_backend}; device "
                           f"{e.device}. Stated: {', '.join(stated) if stated else 'nothing beyond the readings'}. "
                           f"Tolerance ±{o.tolerance:.0%} on each reading. Predictions: {e.metric}, from measured "
                           "calibration steps fitted linearly in B (table at the end)."), ""]
    misses = calibration_misses(e.hypotheses, o.tolerance)
    decided = e.decided and not misses
    lines += [f"**{'Decided' if decided else 'Not decided'}.** {markdown_text(e.conclusion, line_start=False)}", ""]
    if misses:
        lines += ["**The calibration does not hold at full size**: "
                  + markdown_text("; ".join(misses) + ". The predictions come from a straight line through the small "
                                  "calibration steps; where a full-size step contradicts it, the verdicts on the "
                                  "configurations that were only predicted are not evidence: measure the candidates "
                                  "at full size.", line_start=False), ""]
    if not e.confirmed:
        lines += ["**Not confirmed by a full-size run**: "
                  + markdown_text(" ".join(e.notes) or "no GPU here.", line_start=False), ""]
    elif e.notes:
        lines += [markdown_text(" ".join(e.notes)), ""]
    if e.separation is not None:
        lines += ["## The measurement that would separate them", "", markdown_text(e.separation.sentence + "."), ""]
        lines += [markdown_table(pd.DataFrame([{"outcome": name, "predicted fused step": f"{value / GIB:.2f} GiB"}
                                               for name, value in e.separation.predictions])), ""]
    consistent = [h for h in e.hypotheses if h.consistent]
    ruled = [h for h in e.hypotheses if not h.consistent]
    lines += [f"## Consistent with the readings ({len(consistent)})", ""]
    lines += [markdown_table(hypotheses_table(consistent, 20)) if consistent else "None.", ""]
    lines += [f"## Ruled out ({len(ruled)}; the 20 closest)", ""]
    lines += [markdown_table(hypotheses_table(ruled, 20)) if ruled else "None.", ""]
    lines += ["## Calibration steps (measured)", "", markdown_table(calibration_table(e)), ""]
    if environment:
        lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment), "") + [
            "</details>", ""]
    return "\n".join(lines)


def write_explain_report(out_dir: Path) -> Path:
    """Render ``summary.md`` from the folder's ``explain.json`` (and ``environment.json``)."""
    out_dir = Path(out_dir)
    explanation = load_explanation(out_dir)
    return store.write_text(out_dir / "summary.md", render_explain_markdown(explanation, read_environment(out_dir)))
