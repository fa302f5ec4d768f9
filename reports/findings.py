"""Plain-language findings computed from the results frame.

Each finding is one sentence a user can act on, with every number taken from the frame:
what the logits cost, what the fused back-end saves and how the saving grows with B·T,
where a back-end runs out of memory, which back-end holds the least memory and which is the
fastest at each size and which are on the time–memory frontier (:mod:`fusedce_reports.rankings`),
whether parity holds, and how well the analytic memory model predicted the peaks. A
finding's text is plain text (the Markdown page escapes it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fusedce_reports.frame import BASELINE_BACKEND
from fusedce_reports.palette import ordered
from fusedce_reports.rankings import fastest_sentence, largest_frontier_sentence, lowest_memory_sentence
from fusedce_reports.tables import group_title
from fusedce_reports.units import format_bytes, format_error, format_percent, format_tokens, is_missing

PREFERRED_BACKEND = "fusedce"
"""The back-end the headline findings describe when it was measured."""

LINEAR_R2 = 0.99
"""A saving counts as growing linearly with B·T when a straight line explains this much."""

SMALL_SAVING_FRACTION = 0.25
"""Below this fraction of the largest saving, the smallest size's saving is called small."""

PREDICTION_TOLERANCE = (0.05, 64 << 20)
"""The band within which the analytic model counts as right: ±5% or ±64 MiB, whichever is larger."""

_DTYPE_NAME = {"amp-bf16": "bf16", "amp-fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


@dataclass(frozen=True)
class Finding:
    """One sentence of the report. ``topic``: memory, scaling, oom, ranking, speed, frontier,
    parity, prediction, failure or note; ``scope``: the group it is about ("" for the whole run)."""

    topic: str
    scope: str
    text: str


def headline_backend(group: pd.DataFrame) -> str | None:
    """The back-end the findings (and the heatmap) describe: fusedce if it saved anything
    measurable against torch, else the one saving the most at the largest size."""
    ok = group[(group["status"] == "ok") & (group["backend"] != BASELINE_BACKEND)]
    ok = ok[ok["saving_bytes"].notna()]
    if ok.empty:
        return None
    if PREFERRED_BACKEND in set(ok["backend"]):
        return PREFERRED_BACKEND
    largest = ok[ok["tokens"] == ok["tokens"].max()]
    return str(largest.loc[largest["saving_bytes"].idxmax(), "backend"])


def _memory_findings(scope: str, group: pd.DataFrame, hero: str) -> list[Finding]:
    rows = group[(group["backend"] == hero) & group["saving_bytes"].notna()].sort_values("tokens")
    if rows.empty:
        return []
    top = rows.iloc[-1]
    torch_peak = top["torch_peak_bytes"]
    dtype = _DTYPE_NAME.get(top["mode"], top["mode"])
    if top["saving_bytes"] >= 0:
        verdict = (f"{hero} saves {format_bytes(top['saving_bytes'])} ({format_percent(top['saving_frac'])}) "
                   f"of the loss's peak")
    else:
        verdict = (f"{hero} uses {format_bytes(-top['saving_bytes'])} ({format_percent(-top['saving_frac'])}) "
                   f"more than {BASELINE_BACKEND}")
    text = (
        f"At {format_tokens(top['tokens'])} tokens the logits are {format_bytes(top['logits_bytes'])} "
        f"in {dtype}; {verdict}: {BASELINE_BACKEND} {format_bytes(torch_peak)} → {hero} "
        f"{format_bytes(top['peak_bytes'])}"
    )
    if not is_missing(top["x_floor"]):
        text += f", {top['x_floor']:.2f}× the floor of {format_bytes(top['floor_bytes'])} (the gradients)"
    findings = [Finding("memory", scope, text + ".")]

    if len(rows) >= 2 and (rows["saving_bytes"] > 0).all():
        tokens = rows["tokens"].to_numpy(float)
        saving = rows["saving_bytes"].to_numpy(float)
        first = rows.iloc[0]
        if len(rows) >= 3:
            slope, intercept = np.polyfit(tokens, saving, 1)
            fitted = slope * tokens + intercept
            total = float(((saving - saving.mean()) ** 2).sum())
            r2 = 1.0 - float(((saving - fitted) ** 2).sum()) / total if total > 0 else 0.0
            if r2 >= LINEAR_R2 and slope > 0:
                growth = (f"the saving grows linearly with B·T, by about {format_bytes(slope * 1024)} "
                          f"per 1k tokens (straight-line fit, R² = {r2:.3f})")
            else:
                growth = f"the saving is not linear in B·T here (straight-line fit R² = {r2:.2f})"
        else:
            ratio = saving[-1] / saving[0] if saving[0] > 0 else float("nan")
            growth = (f"from {format_tokens(first['tokens'])} to {format_tokens(top['tokens'])} tokens "
                      f"({tokens[-1] / tokens[0]:.0f}× more) the saving grows {ratio:.1f}×")
        text = (f"{growth[0].upper()}{growth[1:]}: {format_bytes(first['saving_bytes'])} at "
                f"{format_tokens(first['tokens'])} tokens, {format_bytes(top['saving_bytes'])} at "
                f"{format_tokens(top['tokens'])}.")
        if saving[0] < SMALL_SAVING_FRACTION * saving[-1]:
            text += " A small batch × sequence length shows little gain: measure at the B·T you train with."
        findings.append(Finding("scaling", scope, text))
    return findings


def _oom_findings(scope: str, group: pd.DataFrame) -> list[Finding]:
    findings = []
    for backend in ordered(group.loc[group["status"] == "oom", "backend"]):
        own = group[group["backend"] == backend]
        first = own[own["status"] == "oom"].sort_values("tokens").iloc[0]
        text = f"{backend} runs out of memory at {format_tokens(first['tokens'])} tokens"
        if not is_missing(first["oom_requested_bytes"]):
            text += f" (it asked for {format_bytes(first['oom_requested_bytes'])} more)"
        ran = group[(group["tokens"] == first["tokens"]) & (group["status"] == "ok")]
        if not ran.empty:
            others = ", ".join(f"{r.backend} ({format_bytes(r.peak_bytes)})" for r in ran.itertuples())
            text += f"; at that size these back-ends still ran: {others}"
        largest_ok = own.loc[own["status"] == "ok", "tokens"]
        if not largest_ok.empty:
            text += f". Its largest size that ran: {format_tokens(int(largest_ok.max()))} tokens"
        findings.append(Finding("oom", scope, text + "."))
    return findings


def _parity_findings(frame: pd.DataFrame) -> list[Finding]:
    checked = frame[frame["parity_ok"].notna() & frame["worst_error"].notna()]
    if checked.empty:
        return []
    failed = checked[checked["parity_ok"] == False]  # noqa: E712 (object column of bools)
    if failed.empty:
        worst = checked.loc[checked["worst_error"].idxmax()]
        return [Finding("parity", "", (
            f"Every back-end's loss and gradients agree with the fp32 reference within its mode's "
            f"tolerance; the largest relative error is {format_error(worst['worst_error'])} "
            f"({worst['backend']}, {format_tokens(worst['tokens'])} tokens, {worst['mode']}, "
            f"tolerance {worst['tolerance']:.0e})."
        ))]
    findings = []
    for backend in ordered(failed["backend"]):
        rows = failed[failed["backend"] == backend]
        worst = rows.loc[rows["worst_error"].idxmax()]
        findings.append(Finding("parity", "", (
            f"PARITY FAILURE: {backend} exceeds the tolerance in {len(rows)} of "
            f"{int((checked['backend'] == backend).sum())} cells; worst relative error "
            f"{format_error(worst['worst_error'])} at {format_tokens(worst['tokens'])} tokens, "
            f"H={worst['hidden']} V={worst['vocab']}, {worst['mode']} (tolerance {worst['tolerance']:.0e})."
        )))
    return findings


def _prediction_findings(frame: pd.DataFrame) -> list[Finding]:
    rows = frame[frame["predicted_error"].notna()]
    if rows.empty:
        return []
    relative, absolute = PREDICTION_TOLERANCE
    miss = (rows["peak_bytes"] - rows["predicted_bytes"]).abs()
    outside = rows[miss > np.maximum(relative * rows["predicted_bytes"], absolute)]
    worst = rows.loc[rows["predicted_error"].abs().idxmax()]
    text = (
        f"The analytic memory model predicted {len(rows) - len(outside)} of {len(rows)} peaks within "
        f"±{relative:.0%} or ±{format_bytes(absolute)}; largest deviation "
        f"{worst['predicted_error']:+.1%} ({worst['backend']}, {format_tokens(worst['tokens'])} tokens, "
        f"H={worst['hidden']} V={worst['vocab']})."
    )
    if not outside.empty:
        names = ", ".join(ordered(outside["backend"]))
        text += f" Outside the band: {names} (a measured peak that the back-end's design does not explain)."
    return [Finding("prediction", "", text)]


def _failure_findings(frame: pd.DataFrame) -> list[Finding]:
    findings = []
    for status in ("error", "skipped"):
        rows = frame[frame["status"] == status]
        for backend in ordered(rows["backend"]):
            own = rows[rows["backend"] == backend]
            message = next((m for m in own["message"] if m), "no message recorded")
            verb = "failed" if status == "error" else "was skipped"
            findings.append(Finding("failure", "", (
                f"{backend} {verb} in {len(own)} cell{'s' if len(own) > 1 else ''}: "
                f"{message.splitlines()[0][:160]}"
            )))
    return findings


def compute_findings(frame: pd.DataFrame) -> list[Finding]:
    """All findings of a run, group by group, then the run-wide ones."""
    findings: list[Finding] = []
    if frame.empty:
        return findings
    if (frame["memory_source"] == "cpu-profiler").any():
        findings.append(Finding("note", "", (
            "Measured on the CPU: peaks are PyTorch's CPU allocator accounting of tensor memory, "
            "not GPU memory; the shapes and ratios carry over, the times do not."
        )))
    keys = ["device", "mode", "hidden", "vocab", "options"]
    for (device, mode, hidden, vocab, options), group in frame.groupby(keys, sort=False):
        scope = group_title(device, mode, int(hidden), int(vocab), options)
        hero = headline_backend(group)
        if hero is not None:
            findings.extend(_memory_findings(scope, group, hero))
        findings.extend(_oom_findings(scope, group))
        for topic, sentence in (("ranking", lowest_memory_sentence(group)), ("speed", fastest_sentence(group)),
                                ("frontier", largest_frontier_sentence(group))):
            if sentence is not None:
                findings.append(Finding(topic, scope, sentence))
    findings.extend(_parity_findings(frame))
    findings.extend(_prediction_findings(frame))
    findings.extend(_failure_findings(frame))
    return findings
