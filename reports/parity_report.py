"""The parity run's report folder: ``summary.md`` and ``plots/parity_loss.png``.

Pure functions of the stored ``parity.json`` (:class:`fusedce_profiler.judgements.parity.ParityReport`)
and ``environment.json``: :func:`write_parity_report` redoes a folder from those files alone
(``fusedce-profile parity`` after each back-end, ``fusedce-profile report DIR`` any time).
:func:`parity_table` and :func:`gap_sentences` are what the terminal prints too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument.interruption import Interruption, read_interruption
from fusedce_profiler.instrument import staging, store
from fusedce_profiler.judgements.parity import (CONTROL, NOISE_FACTOR, CurveGap, ParityCurve, ParityReport, curve_gap,
                                               load_parity_report, relative_difference)
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import code_block, markdown_text, plot_text
from fusedce_reports.figures import new_figure, save_figure
from fusedce_reports.markdown import markdown_table
from fusedce_reports.palette import backend_style

PLOT_FILE = "parity_loss.png"

MAX_CURVES_SHOWN = 40
"""Compared back-ends listed in the table and the sentences (the first ones, in the stored order);
the rest are counted in one line: ``parity.json`` keeps every curve."""

MAX_CURVES_DRAWN = 12
"""Compared back-ends drawn in the plot (the first ones), besides torch."""

PLOT_LIMIT = 1e100
"""A loss (or a per-step gap) beyond ±this is not drawn: an axis spanning ±1.8e308 overflows the
plotting's arithmetic. The table and the sentences keep the stored values; the page counts what the
plot left out."""


def parity_gaps(report: ParityReport, limit: int = MAX_CURVES_SHOWN) -> list[CurveGap]:
    """Each compared back-end's per-step gap to torch (back-ends with no losses left out), of the
    first ``limit`` compared curves, thresholded at the final-loss tolerance. Recomputed from the
    stored losses, so a ``parity.json`` without the peak step rebuilds with it."""
    ref = report.curves[0]
    gaps = (curve_gap(c, ref, report.settings.loss_tolerance) for c in report.curves[1:1 + limit])
    return [g for g in gaps if g is not None]


def left_out_line(report: ParityReport) -> str | None:
    """The sentence saying how many compared back-ends the table and the plot leave out
    (``None`` when they show every one)."""
    compared = len(report.curves) - 1 + len(report.not_run)
    if compared <= MAX_CURVES_DRAWN:
        return None
    listed = min(compared, MAX_CURVES_SHOWN)
    return (f"Showing {listed:,} of {compared:,} back-ends in the table and the sentences, "
            f"{min(MAX_CURVES_DRAWN, len(report.curves) - 1):,} in the plot; parity.json keeps every curve.")


def _drawable(values: list[float]) -> list[float]:
    """``values`` with what cannot be drawn (not finite, beyond ±:data:`PLOT_LIMIT`) as NaN: a gap in the line."""
    return [v if math.isfinite(v) and abs(v) <= PLOT_LIMIT else math.nan for v in values]


def undrawn_losses(report: ParityReport) -> int:
    """Finite losses of the drawn curves that the plot leaves out (beyond ±:data:`PLOT_LIMIT`)."""
    return sum(1 for c in report.curves[:1 + MAX_CURVES_DRAWN] for v in c.losses
               if math.isfinite(v) and abs(v) > PLOT_LIMIT)


def _not_compared(curve: ParityCurve, reference: ParityCurve) -> str | None:
    """Why ``curve`` cannot be compared with torch's run: either of them diverged (its loss is not
    finite from some step: :meth:`~fusedce_profiler.judgements.parity.ParityCurve.divergence`);
    ``None`` when both losses are finite throughout. Such a curve is never shown as a pass."""
    if reference.divergence() is not None:
        return f"not compared: torch {reference.divergence()}"
    return curve.divergence()


def _final_loss_text(curve: ParityCurve) -> str:
    if not curve.losses:
        return "–"
    return "not finite" if curve.diverged_at() is not None else f"{curve.final_loss():.4f}"


def _percent(frac: float) -> str:
    return f"{100 * frac:.1f}%" if frac >= 0.001 else f"{100 * frac:.2g}%"


@dataclass(frozen=True)
class GapSentence:
    """One back-end's gap to torch in plain words: ``lead`` (its largest per-step gap and
    where) and ``detail`` (the losses there, the steps above the tolerance, the final-loss
    difference); ``str()`` joins them."""

    lead: str
    detail: str

    def __str__(self) -> str:
        return f"{self.lead} {self.detail}"

    def markdown(self) -> str:
        """The sentence as Markdown, its lead in bold."""
        return f"**{markdown_text(self.lead)}** {markdown_text(self.detail, line_start=False)}"


def gap_sentences(report: ParityReport) -> list[GapSentence]:
    """One sentence per back-end: its largest per-step gap to torch and where, the steps above
    the tolerance, and the final-loss difference — side by side, so a control run reads at a glance."""
    ref = report.curves[0]
    sentences = []
    for gap in parity_gaps(report):
        curve = next(c for c in report.curves if c.backend == gap.backend)
        why = _not_compared(curve, ref)
        if why is not None:
            sentences.append(GapSentence(f"{gap.backend} vs torch:", why + "."))
            continue
        k = gap.peak_step
        lead = f"{gap.backend} vs torch: at most {_percent(gap.peak)} at step {k}"
        detail = f"({curve.losses[k]:.4f} vs {ref.losses[k]:.4f}); "
        if gap.above:
            where = (f"step {gap.first_above}" if gap.first_above == gap.last_above
                     else f"steps {gap.first_above}–{gap.last_above}")
            detail += f"above {gap.threshold:.0e} on {gap.above} of {len(gap.diffs)} steps ({where}); "
        else:
            detail += f"never above {gap.threshold:.0e}; "
        detail += f"its loss above torch's on {gap.higher} of {len(gap.diffs)} steps; "
        final = relative_difference(curve.final_loss(), ref.final_loss())
        detail += f"final loss {_percent(final)} apart"
        if curve.seconds is not None:
            detail += f"; trained in {curve.seconds:.{1 if curve.seconds < 10 else 0}f} s"
        sentences.append(GapSentence(lead, detail + "."))
    return sentences


def parity_table(report: ParityReport, limit: int = MAX_CURVES_SHOWN) -> pd.DataFrame:
    """One row per back-end (torch first, the reference), of the first ``limit`` compared ones
    (:func:`left_out_line` counts the rest): verdict, final loss, its relative difference to
    torch's, the largest per-step difference, the worst gradient error, why."""
    rows = []
    ref = report.curves[0]
    rows.append({"back-end": ref.backend, "verdict": "reference", "final loss": _final_loss_text(ref),
                 "final loss rel. diff": "–", "max per-step rel. diff": "–", "worst gradient rel. err": "–",
                 "why": ref.divergence() or ""})
    gaps = {g.backend: g for g in parity_gaps(report, limit)}
    for curve, v in zip(report.curves[1:1 + limit], report.verdicts):
        gap = gaps.get(curve.backend)
        why = _not_compared(curve, ref) if curve.losses else None
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[v.passed]
        if why is not None and v.passed is not False:  # a curve that diverged, or one torch's divergence leaves unjudged
            verdict = "FAIL" if curve.diverged_at() is not None else "not judged"
        compared = why is None
        rows.append({
            "back-end": curve.backend,
            "verdict": "control" if curve.backend == CONTROL else verdict,
            "final loss": _final_loss_text(curve),
            "final loss rel. diff": (f"{v.final_loss_rel_diff:.1e}" if compared and v.final_loss_rel_diff is not None
                                     else "–"),
            "max per-step rel. diff": (f"{gap.peak:.1e} (step {gap.peak_step})" if compared and gap is not None
                                       and v.max_step_rel_diff is not None else "–"),
            "worst gradient rel. err": (f"{v.worst_grad_error:.1e} ({v.worst_grad_name})"
                                        if v.worst_grad_error is not None else "–"),
            "why": "; ".join(dict.fromkeys([*v.reasons, *([why] if why else [])])),
        })
    for name in report.not_run[:max(0, limit - len(rows) + 1)]:
        rows.append({"back-end": name, "verdict": "not run", "final loss": "–", "final loss rel. diff": "–",
                     "max per-step rel. diff": "–", "worst gradient rel. err": "–",
                     "why": "the run ended before this back-end trained"})
    return pd.DataFrame(rows)


def plot_parity(report: ParityReport, path: Path) -> Path:
    """Loss curves of torch and the first :data:`MAX_CURVES_DRAWN` compared back-ends (top) and their
    relative difference to torch (bottom); values beyond ±:data:`PLOT_LIMIT` are not drawn."""
    curves = report.curves[:1 + MAX_CURVES_DRAWN]
    names = [c.backend for c in curves]
    fig, (top, bottom) = new_figure((9, 7), 2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    ref = report.curves[0]
    for curve in curves:
        if not curve.losses:
            continue
        style = backend_style(curve.backend, names)
        is_ref = curve is ref  # drawn dashed on top, so identical curves stay visible
        top.plot(range(len(curve.losses)), _drawable(curve.losses), color=style["color"],
                 linewidth=style["linewidth"], linestyle="--" if is_ref else "-", zorder=4 if is_ref else 2,
                 label=plot_text(curve.backend))
    for gap in parity_gaps(report, MAX_CURVES_DRAWN):
        style = backend_style(gap.backend, names)
        diff = _drawable([d if d > 0 else float("nan") for d in gap.diffs])
        bottom.semilogy(range(len(diff)), diff, color=style["color"], label=plot_text(
            f"{gap.backend}: max {_percent(gap.peak)} at step {gap.peak_step} (gaps: equal losses)"))
        if 0 < gap.peak <= PLOT_LIMIT:
            bottom.plot([gap.peak_step], [gap.peak], marker="v", color=style["color"], markersize=8,
                        linestyle="none")
    top.axhline(report.entropy_rate, color="black", linestyle=":", linewidth=1,
                label=f"data entropy rate {report.entropy_rate:.3f}")
    s = report.settings
    top.set_title(plot_text(
        f"Training parity: {s.config.name}, {s.mode}, B={s.batch} T={s.seq}, reduction={s.reduction}"
        + (", tied" if s.config.tie_word_embeddings else "") + (", bias" if s.config.lm_head_bias else "")
        + (f", {s.ignore_frac:.0%} padding" if s.ignore_frac else "") + f", seed {s.seed}"))
    top.set_ylabel("training loss")
    top.legend(fontsize=9)
    top.grid(alpha=0.3)
    bottom.axhline(s.loss_tolerance, color="grey", linestyle="--", linewidth=1, label="final-loss tolerance")
    bottom.set_ylabel("|L − L_torch| / L_torch")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    if bottom.lines:
        bottom.legend(fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _noise_lines(report: ParityReport) -> list[str]:
    s, floor = report.settings, report.noise_floor
    if floor is not None:
        limit = max(s.loss_tolerance, NOISE_FACTOR * floor)
        return [f"Noise floor: the control (*{markdown_text(CONTROL)}*: torch from initial weights moved by one "
                f"rounding of the mode's precision) ends {_percent(floor)} from torch, so a back-end's final loss "
                f"fails beyond {_percent(limit)} (the tolerance, or {NOISE_FACTOR:g}× the floor if larger); the "
                "gradient check, on identical weights, is the sharp test of the wiring."]
    if any(c.backend == CONTROL for c in report.curves):
        return ["The perturbed-torch control did not finish: back-ends were judged against the tolerance alone."]
    return ["No control ran (`--no-control`, or a parity.json without one): the final-loss "
            "tolerance alone cannot tell a chaotic training run from a wrong loss."]


def render_parity_markdown(report: ParityReport, environment: dict, plot: Path,
                           interruption: Interruption | None = None) -> str:
    """The whole ``summary.md`` of a parity folder; ``plot`` is the loss-curve PNG; ``interruption``:
    the mark of a run a signal stopped."""
    s = report.settings
    ref = report.curves[0]
    verdict = "PASS" if report.passed else "FAIL"
    if verdict == "PASS" and (interruption is not None or report.not_run):  # a pass needs every back-end's run
        verdict = "INTERRUPTED" if interruption is not None else "INCOMPLETE"
    lines = [f"# fusedce-profile parity: {verdict}", ""]
    if interruption is not None:
        lines += [f"**{markdown_text(interruption.sentence(), line_start=False)}**", ""]
    if report.not_run:
        lines += [f"**Incomplete run.** {markdown_text(', '.join(report.not_run), line_start=False)} did not "
                  "train: the run ended early.", ""]
    lines += [f"{s.steps} AdamW steps (lr {s.lr}) of {markdown_text(s.config.name)} from the same initialisation "
              f"on the same batches (a random Markov chain, entropy rate {report.entropy_rate:.3f} nats; seed "
              f"{s.seed}), {markdown_text(s.mode)} on {markdown_text(s.device)}. "
              + (f"torch's run {ref.divergence()}, so nothing can be concluded." if ref.diverged_at() is not None else
                 f"torch's loss went from {ref.initial_loss():.3f} to {ref.final_loss():.3f}"
                 + ("" if report.reference_learned else " — it did NOT learn, so nothing can be concluded") + "."),
              f"Tolerances: final loss (mean of the last tenth of the steps) within {s.loss_tolerance:.0e} relative "
              f"of torch's; gradients of the LM head weight"
              f"{' (the tied embedding)' if s.config.tie_word_embeddings else ''}"
              f"{', its bias' if s.config.lm_head_bias else ''} and the hidden states within {s.grad_tolerance:.0e} "
              f"of eager torch in fp32 on the same weights, at steps {', '.join(map(str, s.check_steps))}."]
    lines += _noise_lines(report)
    lines += ["", markdown_table(parity_table(report)), ""]
    lines += [line for line in (left_out_line(report),) if line] + [""] * bool(left_out_line(report))
    gaps = gap_sentences(report)
    if gaps:
        lines += ["## Loss curves against torch, step by step", "",
                  "Relative difference |L − L_torch| / L_torch at each step (both runs see the same batch at "
                  "the same step). When every back-end, torch.compile included, strays from torch by a "
                  "similar amount along the run, the gap is the trajectory's sensitivity to rounding, not "
                  "one back-end's error.", ""] + [f"- {gap.markdown()}" for gap in gaps] + [""]
    lines += [f"![loss curves](plots/{plot.name})", ""]
    if undrawn_losses(report):
        lines += [f"{undrawn_losses(report):,} stored losses beyond ±{PLOT_LIMIT:.0e} are not drawn (the plot cannot "
                  "span them); the table uses them as stored.", ""]
    lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment or {}), "")
    lines += ["</details>", ""]
    return "\n".join(lines)


@staging.all_or_nothing()  # the page and its plot together, or none (a full disk, a signal)
def write_parity_report(out_dir: Path) -> tuple[Path, ParityReport]:
    """Render ``summary.md`` and ``plots/parity_loss.png`` from the folder's ``parity.json`` (and
    ``environment.json``); returns the summary's path and the report (its ``passed`` decides
    the exit code)."""
    out_dir = Path(out_dir)
    report = load_parity_report(out_dir)
    png = plot_parity(report, out_dir / store.PLOTS_DIR / PLOT_FILE)
    text = render_parity_markdown(report, read_environment(out_dir), png, read_interruption(out_dir))
    return store.write_text(out_dir / "summary.md", text), report
