"""The model mode's report folder: results files, ``summary.md`` and PNG plots.

Pure functions of the results (``model_results.jsonl``): :func:`write_model_report` redoes
a folder from its files alone (``fusedce-profile report DIR``); the parity run's report is
:mod:`fusedce_reports.parity_report`. The tables of a traced step's attribution are
:mod:`fusedce_reports.attribution_tables`, the plots :mod:`fusedce_reports.plots.model`. Tables reuse
:mod:`fusedce_reports` (units, Markdown tables) so the look matches the grid's report.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument.interruption import Interruption, read_interruption
from fusedce_profiler.instrument import staging, store
from fusedce_profiler.judgements.fit import FitResult, load_fits
from fusedce_profiler.instrument.precision import MODE_WORDS
from fusedce_profiler.instrument.step.jobs import ModelResult, load_model_results
from fusedce_profiler.instrument.tracing.attribution import GROUPS, logits_verdict
from fusedce_reports.attribution_tables import (activation_split, attribution_table, detector_table, largest_term,
                                        traced_results)
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import Markdown, code_block, link_target, markdown_text
from fusedce_reports.markdown import markdown_table
from fusedce_reports.plots.model import (MAX_SHOWN_ROWS, plot_attribution, plot_breakdown, plot_reserved,
                                       shown_rows)
from fusedce_reports.units import format_bytes, format_ms, format_percent

REFERENCE = "torch"
#: Back-ends that compute the plain loss without fusing it: their logits are expected, not a failure.
UNFUSED = ("torch-compile",)


def saving_ceiling(ref: ModelResult) -> tuple[int, float, str]:
    """The most any loss can save of torch's peak: ``(bytes, share of the peak, what it is)``.

    With a traced step it is what the LM head and the loss hold at the traced peak (measured:
    at an optimizer-phase peak the logits are gone and the ceiling is small); without one, the
    loss region's bytes over the activations at the loss phase. ``what`` has two ``{}`` for
    the bytes and the share.
    """
    if ref.attribution is not None and ref.attribution.peak_bytes:
        a = ref.attribution
        held = a.group_bytes("LM-head/loss")
        return held, held / a.peak_bytes, "the LM head and loss hold {} ({}) of torch's traced peak"
    return ref.memory.loss_extra, ref.memory.loss_share, "torch's loss region adds {} ({}) to its peak"


def _ceiling_sentence(ref: ModelResult) -> str:
    """One sentence of :func:`saving_ceiling`, the same wherever a report states it."""
    held, share, what = saving_ceiling(ref)
    text = what.format(format_bytes(held), format_percent(share))
    return f"{text[0].upper()}{text[1:]}: no loss can save more than that here."
RESULTS_FILE = store.MODEL_RESULTS_FILE


# --- model ---------------------------------------------------------------------------------

def missing_rows(results: list[ModelResult]) -> list[str]:
    """Sentences naming the rows a run that was cut short never wrote.

    ``model --eval-step`` writes every back-end's plain row, then every ``+eval`` row, in
    that order; so once any ``+eval`` row is present, a back-end with a plain row but no
    ``+eval`` row was not measured. (A run cut before its first ``+eval`` row, or before a
    plain row, cannot be told apart from a run that never asked for it.)
    """
    if not any(r.job.eval_step for r in results):
        return []
    measured = {repr(r.job) for r in results if r.job.eval_step}  # one pass: the file may hold 20,000 rows
    absent = [r.job.label for r in results
              if not r.job.eval_step and repr(dataclasses.replace(r.job, eval_step=True)) not in measured]
    if not absent:
        return []
    return [f"+eval rows for {_names(absent)} were not measured: the run ended early "
            f"({RESULTS_FILE} has +eval rows for {_names([r.job.backend for r in results if r.job.eval_step])} "
            "only)."]


def _names(names: list[str]) -> str:
    """``names`` joined, the first :data:`~fusedce_reports.plots.model.MAX_SHOWN_ROWS` of them and
    the others counted."""
    shown = ", ".join(names[:MAX_SHOWN_ROWS])
    return shown if len(names) <= MAX_SHOWN_ROWS else f"{shown} and {len(names) - MAX_SHOWN_ROWS:,} more"


def _reference(results: list[ModelResult], result: ModelResult) -> ModelResult | None:
    """The torch result of the same model, batch and settings (without the eval pass)."""
    for other in results:
        job, ref = result.job, other.job
        if (ref.backend == REFERENCE and other.status == "ok" and not ref.eval_step
                and dataclasses.replace(ref, backend=job.backend, eval_step=job.eval_step) == job):
            return other
    return None


def replaced_text(result: ModelResult) -> str:
    """What the back-end replaced in the model, grouped as the attribution groups it
    (``"nothing"`` for the unmodified model)."""
    return "; ".join(f"{x.what}" + (f" ×{x.count}" if x.count > 1 else "") + f" ({x.group})"
                     for x in result.replaced) or "nothing"


def model_table(results: list[ModelResult]) -> pd.DataFrame:
    """One row per result: peak, loss region, saving vs torch, reserved, nvidia-smi, time, and
    what the back-end replaced."""
    rows = []
    for r in results:
        m = r.memory
        ref = _reference(results, r)
        saving = (ref.memory.peak - m.peak) if (m and ref and ref is not r) else None
        rows.append({
            "model": f"{r.job.config.name} B={r.job.batch} T={r.job.seq}"
                     + (" tied" if r.job.config.tie_word_embeddings else ""),
            "back-end": r.job.label,
            "status": r.status if r.status == "ok" else f"{r.status}: {r.message.splitlines()[0][:80]}",
            "peak allocated": format_bytes(m.peak) if m else "–",
            "peak phase": m.peak_phase if m else "–",
            "loss region": format_bytes(m.loss_extra) if m else "–",
            "loss share of peak": format_percent(m.loss_share) if m else "–",
            "saving vs torch": (f"{format_bytes(saving)} ({format_percent(saving / ref.memory.peak)})"
                                if saving is not None else "–"),
            "peak reserved": format_bytes(m.peak_reserved) if m and m.peak_reserved is not None else "–",
            "nvidia-smi at peak": format_bytes(m.smi_peak) if m and m.smi_peak is not None else "–",
            "step time": format_ms(r.time_ms),
            "replaced": replaced_text(r) if r.status == "ok" else "–",
        })
    return pd.DataFrame(rows)


def breakdown_table(result: ModelResult) -> pd.DataFrame:
    """The peak's composition (sums to the peak) and the other sizes, for one result."""
    m = result.memory
    rows = [{"part": p.name, "bytes": format_bytes(p.bytes), "share of peak": format_percent(p.bytes / m.peak)}
            for p in m.composition]
    rows.append({"part": Markdown(f"**{markdown_text(f'peak ({m.peak_phase} phase)', line_start=False)}**"),
                 "bytes": Markdown(f"**{format_bytes(m.peak)}**"),
                 "share of peak": "100%"})
    return pd.DataFrame(rows)


def sizes_table(result: ModelResult) -> pd.DataFrame:
    m = result.memory
    rows = [
        ("parameters (fp32)", m.parameters),
        ("gradients (fp32, at the end of backward)", m.gradients),
        ("optimizer state (AdamW exp_avg + exp_avg_sq)", m.optimizer_state),
        ("activations left by the forward (at loss entry)", m.activations),
        ("  of which tensors saved for backward (hooks)", m.saved_tensors),
        ("  of which autocast bf16 weight copies", m.weight_copies),
        ("loss region's own extra (peak above its start)", m.loss_extra),
    ]
    if m.context is not None:
        rows.append(("CUDA context + non-allocator memory", m.context))
    return pd.DataFrame([{"size": name, "bytes": format_bytes(value)} for name, value in rows])


def _counterpart(results: list[ModelResult], result: ModelResult) -> ModelResult | None:
    """The same job without the evaluation pass (for a ``+eval`` result)."""
    for other in results:
        if other.status == "ok" and other.job == dataclasses.replace(result.job, eval_step=False):
            return other
    return None


def _group_sentence(r: ModelResult, ref: ModelResult) -> str:
    """Where a back-end's saving against torch comes from: the LM-head/loss kinds vs the rest."""
    a, ra = r.attribution, ref.attribution
    loss = ra.group_bytes("LM-head/loss") - a.group_bytes("LM-head/loss")
    others = {g: ra.group_bytes(g) - a.group_bytes(g) for g in ("norms", "MLP", "attention")}
    text = f"Of its saving at the traced peak, {format_bytes(loss)} is in the LM-head/loss kinds"
    moved = [f"{format_bytes(v)} in {g}" for g, v in others.items() if abs(v) >= max(1 << 20, 0.01 * ra.peak_bytes)]
    replaced_other = sorted({x.group for x in r.replaced if x.group not in ("LM-head/loss",)})
    if moved:
        text += ", " + ", ".join(moved)
        if replaced_other:
            text += f" (it also replaced: {', '.join(replaced_other)})"
    return text + "."


def _head_notes(results: list[ModelResult]) -> list[str]:
    seen, out = set(), []
    for r in results:
        h = r.head
        if h is None or (h.path, h.weight) in seen:
            continue
        seen.add((h.path, h.weight))
        line = (f"LM head: {h.path} ({h.found_by}); its forward multiplies by {h.weight} "
                f"({h.vocab} × {h.hidden})" + (f", the same parameter as {', '.join(h.weight_aliases)}"
                                               if h.weight_aliases else "")
                + (", tied to the input embedding" if h.tied else ", untied") + ".")
        out.append(" ".join([line] + [note[:1].upper() + note[1:] for note in h.notes]))
    return out


def findings(results: list[ModelResult]) -> list[str]:
    """Plain-language sentences computed from the results.

    For each fused back-end: the logits detector's verdict (with its evidence), where its
    saving comes from (the LM-head/loss kinds vs norms, MLP, attention), or that the peak
    moved to another phase, or that the loss was a small part of torch's peak. For torch:
    the largest measured term of its peak.
    """
    out = _head_notes(results)
    for r in results:
        ref = _reference(results, r)
        if r.status != "ok" or ref is None:
            continue
        m, rm = r.memory, ref.memory
        if r.job.eval_step:
            plain = _counterpart(results, r)
            if plain is not None and m.peak_reserved is not None and plain.memory.peak_reserved is not None:
                kept = m.peak_reserved > 1.05 * plain.memory.peak_reserved
                change = m.peak_reserved - plain.memory.peak_reserved
                sign = "+" if change >= 0 else "−"
                out.append(f"{r.job.label}: after an evaluation pass over full logits, the training step's peak "
                           f"reserved is {format_bytes(m.peak_reserved)} (nvidia-smi {format_bytes(m.smi_peak)}) "
                           f"against {format_bytes(plain.memory.peak_reserved)} (nvidia-smi "
                           f"{format_bytes(plain.memory.smi_peak)}) without it, for an allocated peak of "
                           f"{format_bytes(m.peak)} vs {format_bytes(plain.memory.peak)}: "
                           + ("the allocator's cache keeps the evaluation's high-water mark, and nvidia-smi shows it."
                              if kept else f"the evaluation pass changed it by {sign}{format_bytes(abs(change))} "
                              f"({change / plain.memory.peak_reserved:+.1%}), less than 5%: no large reservation "
                              "was left behind."))
            continue
        if r is ref:
            sentence = (f"{r.job.config.name} at B={r.job.batch}×T={r.job.seq}: torch peaks at "
                        f"{format_bytes(m.peak)} allocated ({m.peak_phase} phase); its loss region adds "
                        f"{format_bytes(m.loss_extra)} ({format_percent(m.loss_share)} of the peak); activations "
                        f"{format_bytes(m.activations)}, parameters + gradients + AdamW state "
                        f"{format_bytes(m.parameters + m.gradients + m.optimizer_state)}.")
            if r.attribution is not None:
                a = r.attribution
                sentence += (f" Measured at the traced peak, the activations are {activation_split(a)}."
                             f" Largest term at the peak — {largest_term(a)}.")
            sentence += " " + _ceiling_sentence(r)
            out.append(sentence)
            continue
        saving = rm.peak - m.peak
        sentence = (f"{r.job.label}: peak {format_bytes(m.peak)} ({m.peak_phase} phase), saves "
                    f"{format_bytes(saving)} ({format_percent(saving / rm.peak)}) of torch's peak; its loss region "
                    f"is {format_bytes(m.loss_extra)} vs torch's {format_bytes(rm.loss_extra)}.")
        if m.smi_peak is not None and rm.smi_peak is not None:
            sentence += (f" On nvidia-smi: {format_bytes(m.smi_peak)} vs torch's {format_bytes(rm.smi_peak)} "
                         f"(saves {format_bytes(rm.smi_peak - m.smi_peak)}).")
        if r.attribution is not None:
            sentence += (" Logits detector: " + logits_verdict(r.attribution, naive=False,
                                                                fused=r.job.backend not in UNFUSED)[1] + ".")
        elif rm.loss_extra > 0 and m.loss_extra >= 0.8 * rm.loss_extra:
            sentence += (" Its loss region is as large as torch's; this step was not traced, so the logits detector "
                         "did not run and whether the fused path was active is not known from it (run with --trace).")
            if ref.attribution is not None:
                sentence += " " + _group_sentence(r, ref)
        if m.peak_phase != "loss" and rm.peak_phase == "loss":
            sentence += (f" The peak is now in the {m.peak_phase} phase: the loss no longer decides it, and "
                         "activations (checkpointing, a smaller batch) are the next lever.")
        elif saving_ceiling(ref)[1] < 0.25:
            sentence += " " + _ceiling_sentence(ref)
        out.append(sentence)
    return out


def logits_status(result: ModelResult) -> str | None:
    """The logits detector's status for a result (``materialised``/``transient``/``none``)."""
    if result.attribution is None:
        return None
    return logits_verdict(result.attribution, naive=result.job.backend == REFERENCE,
                          fused=result.job.backend not in UNFUSED)[0]


def group_saving_table(results: list[ModelResult]) -> pd.DataFrame:
    """Per back-end, the saving against torch's traced peak split by what a back-end can replace:
    the LM-head/loss kinds vs norms, MLP, attention and the rest, and what it replaced."""
    rows = []
    traced = traced_results(results)
    for r in traced:
        ref = _reference(traced, r)
        if ref is None or ref is r or r.job.eval_step:
            continue
        a, ra = r.attribution, ref.attribution
        row = {"back-end": r.job.label}
        for group in GROUPS:
            saving = ra.group_bytes(group) - a.group_bytes(group)
            row[f"saved in {group}"] = format_bytes(saving) if saving else "0"
        row["total saved"] = format_bytes(ra.peak_bytes - a.peak_bytes)
        row["replaced"] = replaced_text(r)
        rows.append(row)
    return pd.DataFrame(rows)


def fit_table(fits: list[FitResult]) -> pd.DataFrame:
    rows = []
    for f in fits:
        best = f.best.memory if f.best is not None and f.best.memory is not None else None
        rows.append({
            "back-end": f.backend,
            f"largest {f.axis} under {format_bytes(f.limit_bytes)}": (
                f"{f.search.largest}" + (" (search maximum)" if f.search.hit_maximum else "")
                if f.search.largest else "none fits"),
            "peak allocated there": format_bytes(best.peak) if best else "–",
            "nvidia-smi there": format_bytes(best.smi_peak) if best and best.smi_peak is not None else "–",
            "probes (value: fits)": ", ".join(f"{n}:{'y' if ok else 'n'}" for n, ok in f.search.probes),
        })
    return pd.DataFrame(rows)


def render_model_markdown(results: list[ModelResult], fits: list[FitResult], environment: dict,
                          plots: list[Path], problems: list[str] = (), interruption: Interruption | None = None,
                          notes: list[str] = ()) -> str:
    """``summary.md`` of ``results`` as given; ``notes`` (what the page left out) are said first."""
    source = results[0].memory.source if results and results[0].memory else "cuda-allocator"
    lines = ["# fusedce-profile model: one training step, memory by part", ""]
    if notes:
        lines += [f"**Note.** {markdown_text(n, line_start=False)}" for n in notes] + [""]
    if interruption is not None:
        lines += [f"**{markdown_text(interruption.sentence(), line_start=False)}**", ""]
    missing = missing_rows(results) + [f"a line of the results was not read: {p}" for p in problems]
    if missing:
        lines += [f"**Incomplete run.** {markdown_text(s, line_start=False)}" for s in missing] + [""]
    lines += [f"- {markdown_text(s)}" for s in findings(results)] + [""]
    lines += ["## Peak per back-end", "", markdown_table(model_table(results)), ""]
    if traced_results(results):
        lines += ["## Peak by module and kind (measured)", "",
                  "Every block alive at the traced step's peak, classified by the module that allocated it "
                  "(backward allocations by the forward op that created their autograd node); the traced peak is "
                  "checked against the metered one (gap).", "", markdown_table(attribution_table(results)), ""]
        savings = group_saving_table(results)
        if not savings.empty:
            lines += ["### Where each back-end's saving comes from", "",
                      "The loss's saving is the change in the LM-head/loss kinds; a back-end that also replaced "
                      "norms, MLP or RoPE saves there too, and that is not the loss's doing.", "",
                      markdown_table(savings), ""]
        detected = detector_table(results)
        if not detected.empty:
            lines += ["### Logits detector: allocations of at least N·V bytes", "",
                      "Kept for backward = allocated before `loss.backward()` began and still alive after it: what "
                      "materialised logits do and a fused loss never does.", "", markdown_table(detected), ""]
    for r in results:
        if r.status == "ok":
            lines += [f"## {markdown_text(r.job.label)}: composition of the peak", "", markdown_table(breakdown_table(r)), "",
                      markdown_table(sizes_table(r)), ""]
    if fits:
        lines += ["## Largest size that fits", "", markdown_table(fit_table(fits)), ""]
    lines += [f"![{markdown_text(p.stem)}]({link_target('plots/' + p.name)})" for p in plots] + [""]
    lines += ["## How it was measured", "",
              "One training step (forward, loss, backward, AdamW step) after a warm-up step, "
              + "; ".join(MODE_WORDS.get(mode, markdown_text(mode)) for mode in sorted({r.job.mode for r in results}))
              + ", each back-end in its own process. "
              + ("Memory: the CUDA caching allocator's allocated bytes (tensors), reset at each phase; "
                 "reserved = allocated + the allocator's cache; nvidia-smi = reserved + the CUDA context "
                 "(measured with `mem_get_info`)." if source == "cuda-allocator" else
                 "Memory: the CPU allocator's allocation events recorded by the PyTorch profiler "
                 "(tensor bytes only; no reserved or nvidia-smi figures on the CPU)."),
              "The composition sums exactly to the peak: static bytes at the step's start, then what the "
              "phase holding the peak added (activations left by the forward, then the loss region or the "
              "backward's working set).", ""]
    lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment), "") + [
        "</details>", ""]
    return "\n".join(lines)


@staging.all_or_nothing()  # the page and its plots together, or none (a full disk, a signal)
def write_model_report(out_dir: Path) -> Path:
    """Render ``summary.md`` and the plots (``breakdown.png``; ``reserved.png`` on CUDA) from the
    folder's stored files alone: ``model_results.jsonl``, and ``fit.json``, ``environment.json``
    and ``interrupted.json`` when present."""
    out_dir = Path(out_dir)
    loaded = load_model_results(out_dir)
    fits, environment = load_fits(out_dir), read_environment(out_dir)
    # every table, plot and finding is of the first MAX_SHOWN_ROWS jobs (the run measures torch, the
    # reference the others are compared with, first): a page whose size does not grow with the file
    results, left_out = shown_rows(loaded.records, "jobs", RESULTS_FILE)
    fits, fits_left_out = shown_rows(fits, "fits", store.FIT_FILE)
    problems, unread = shown_rows(loaded.problems, "lines not read", RESULTS_FILE)
    notes = [n for n in (left_out, fits_left_out, unread) if n]
    plots = [p for p in (plot_breakdown(results, out_dir / store.PLOTS_DIR / "breakdown.png"),
                         plot_attribution(results, out_dir / store.PLOTS_DIR / "attribution.png"),
                         plot_reserved(results, out_dir / store.PLOTS_DIR / "reserved.png")) if p]
    text = render_model_markdown(results, fits, environment, plots, problems=problems,
                                 interruption=read_interruption(out_dir), notes=notes)
    return store.write_text(out_dir / "summary.md", text)
