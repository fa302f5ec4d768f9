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
from fusedce_profiler.judgements.explain.records import MIB, Explanation, Hypothesis, load_explanation
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import code_block, markdown_text
from fusedce_reports.listing import listed
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
        span = h.batch_range
        rows.append({
            "rank": rank, "B": h.batch, "B reaching naive": "–" if span is None else
            (f"{span[0]}" if span[0] == span[1] else f"{span[0]}–{span[1]}"), "T": f.seq,
            "attention": f.attention, "tied": "yes" if f.tied else "no",
            "checkpointing": "yes" if f.checkpointing else "no", "eval pass": "yes" if f.eval_step else "no",
            "fused path": "active" if h.fused_active else "NOT active",
            "predicted naive": _mib(h.predicted_naive), "predicted saving": _mib(h.predicted_saving),
            "peak phase": h.peak_phase_naive + ("" if not h.fused_active else f" / {h.peak_phase_fused}"),
            "tolerance naive": f"±{h.tolerance_naive.total / MIB:,.0f} MiB",
            "tolerance saving": f"±{h.tolerance_saving.total / MIB:,.0f} MiB",
            "measured naive": _mib(h.measured_naive), "measured fused": _mib(h.measured_fused),
            "verdict": "consistent" if h.consistent else "ruled out", "why": h.why,
        })
    return pd.DataFrame(rows)


def calibration_table(explanation: Explanation) -> pd.DataFrame:
    """One row per calibration, of the first :data:`~fusedce_reports.listing.MAX_LISTED`."""
    rows = []
    for c in listed(explanation.calibrations, "calibrations", store.EXPLAIN_FILE)[0]:
        rows.append({"back-end": c.backend, "family": c.family.label(),
                     "measured peak": ", ".join(f"B={b}: {_mib(f) if f is not None else s}"
                                                for b, f, s in zip(c.batches, c.figures, c.statuses)),
                     "phase lines (MiB)": "; ".join(f"{name} {a / MIB:,.0f} + {b / MIB:,.1f}·B"
                                                    for name, (a, b) in c.lines.items()) or "not fitted"})
    return pd.DataFrame(rows)


def render_explain_markdown(e: Explanation, environment: dict | None = None) -> str:
    """The whole ``summary.md``; each stored list shown up to :data:`~fusedce_reports.listing.MAX_LISTED`
    items, the rest counted in one line."""
    o = e.observation
    source = store.EXPLAIN_FILE
    failed_backends, more_backends = listed(list(e.failed_backends.items()), "failed back-ends", source)
    failed_steps, more_steps = listed(e.failed_steps, "failed-step sentences", source)
    notes, more_notes = listed(e.notes, "notes", source)
    confirmations, more_confirmations = listed(e.confirmations, "full-size steps", source)
    ruled_out, more_ruled_out = listed(e.ruled_out_families, "ruled-out families", source)
    others, more_others = listed(e.others, "other causes", source)
    stated = [f"{k}={getattr(o, k)}" for k in ("batch", "seq", "attention", "tied", "checkpointing", "eval_step",
                                               "fused_active", "context_mib") if getattr(o, k) is not None]
    title = (f"# fusedce-profile explain: {_reading(o.naive_mib)} → {_reading(o.fused_mib)} MiB on a "
             f"{o.total_gib:g} GiB card")
    lines = [title + (" (INTERRUPTED: partial)" if e.interrupted else "") + (" (FAILED)" if e.failed_backends else ""), "",
             markdown_text(f"Model: {e.model}; precision {o.mode}; fused back-end {o.fused_backend}; device "
                           f"{e.device}. Stated: {', '.join(stated) if stated else 'nothing beyond the readings'}. "
                           f"Figures: {e.metric}, predicted per phase (forward, loss, backward, optimizer) from "
                           "measured calibration steps, each phase linear in B, the step's peak the maximum "
                           "(table at the end). The naive reading pins B; the saving (naive − fused) is judged "
                           "jointly with it."), ""]
    if e.prediction_only:
        lines += ["**Predictions only (CPU): no verdict.** " + markdown_text(e.conclusion, line_start=False), ""]
    else:
        lines += [f"**{'Decided' if e.decided else 'Not decided'}.** "
                  f"{markdown_text(e.conclusion, line_start=False)}", ""]
    if e.failed_backends or e.failed_steps:
        lines += ["## Failed calibration steps", ""] + \
            [f"- {markdown_text(f'{backend} failed in every one; the first, {message}', line_start=False)}"
             for backend, message in failed_backends] + \
            [f"- {markdown_text(sentence, line_start=False)}" for sentence in failed_steps] + [""] + more_backends + more_steps
    if e.notes:
        lines += [markdown_text(n) for n in notes] + [""] + more_notes
    if e.confirmations:
        lines += ["## Full-size steps (measured under the card's cap)", ""] + \
            [f"- {markdown_text(c, line_start=False)}" for c in confirmations] + [""] + more_confirmations
    if e.separation is not None:
        lines += ["## The measurement that would separate them", "", markdown_text(e.separation.sentence + "."), ""]
        if e.separation.predictions:
            predictions, more_predictions = listed(e.separation.predictions, "predicted outcomes", source)
            lines += [markdown_table(pd.DataFrame([{"outcome": name, "predicted": f"{value:,.2f} {unit}"}
                                                   for name, value, unit in predictions])), ""] + more_predictions
    if e.ruled_out_families:
        lines += ["## Ruled out at every batch size", ""] + \
            [f"- {markdown_text(s, line_start=False)}" for s in ruled_out] + [""] + more_ruled_out
    if e.others:
        lines += ["## Other causes", "", markdown_table(pd.DataFrame(
            [{"cause": o.name, "verdict": "consistent" if o.consistent else "ruled out", "numbers": o.why}
             for o in others])), ""] + more_others
    consistent = [h for h in e.hypotheses if h.consistent]
    ruled = [h for h in e.hypotheses if not h.consistent]
    lines += [f"## Consistent with the readings ({len(consistent)})", ""]
    lines += [markdown_table(hypotheses_table(consistent, 20)) if consistent else "None.", ""]
    lines += [f"## Ruled out ({len(ruled)}; the 20 closest)", ""]
    lines += [markdown_table(hypotheses_table(ruled, 20)) if ruled else "None.", ""]
    lines += ["## Calibration steps (measured)", "", markdown_table(calibration_table(e)), ""]
    lines += listed(e.calibrations, "calibrations", source)[1]
    if environment:
        lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment), "") + [
            "</details>", ""]
    return "\n".join(lines)


def write_explain_report(out_dir: Path) -> Path:
    """Render ``summary.md`` from the folder's ``explain.json`` (and ``environment.json``)."""
    out_dir = Path(out_dir)
    explanation = load_explanation(out_dir)
    return store.write_text(out_dir / "summary.md", render_explain_markdown(explanation, read_environment(out_dir)))
