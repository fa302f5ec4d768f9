"""The report of training steps recorded inside the user's own loop (``fusedce_profile``).

A pure function of the folder's ``recorded_steps.jsonl``, ``snapshots/*.timeline.json`` and
``environment.json`` (:func:`write_recorded_report`; ``fusedce-profile report DIR`` calls it):
``summary.md`` and ``plots/`` (the attribution bars of :mod:`fusedce_reports.plots.model`, one memory
timeline per snapshot, and the phases of every step). Nothing is unpickled.

Findings, per recorded step: the peak (allocated, reserved, nvidia-smi), the logits detector's
verdict with its evidence, the largest term at the peak, whether the LM head ran, and whether
an evaluation pass (Lightning's sanity check or validation, Hugging Face's evaluation) raised
the allocator's reserved memory before the step — what makes ``nvidia-smi`` show an
evaluation's high-water mark instead of the step's. Runs of the same step under different
labels (``naive``, ``fused``) are compared.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument import staging, store
from fusedce_profiler.instrument.recording.records import RecordedStep, load_recorded_steps
from fusedce_profiler.instrument.tracing.attribution import Attribution, logits_verdict
from fusedce_reports.attribution_tables import attribution_table, detector_table, largest_term
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import code_block, markdown_text, plot_text
from fusedce_reports.figures import new_figure, save_figure
from fusedce_reports.markdown import markdown_table
from fusedce_reports.plots.model import MAX_SHOWN_ROWS, plot_attribution, shown_rows
from fusedce_reports.timeline import plot_timeline, read_timeline, timeline_file, timeline_plot_name
from fusedce_reports.units import GIB, format_bytes, format_ms, format_percent

MIB = 1 << 20
#: An evaluation pass "raised" reserved memory when it added more than this much (or 1% of it).
RAISED_BYTES = 16 * MIB


@dataclass
class _Job:
    label: str
    batch: int
    seq: int


@dataclass
class _Traced:
    """A recorded step in the shape :mod:`fusedce_reports.attribution_tables`' attribution and detector
    tables and :mod:`fusedce_reports.plots.model`'s attribution plot read (``status``, ``attribution``, ``job.label/batch/seq``)."""

    status: str
    attribution: Attribution
    job: _Job


def step_name(r: RecordedStep) -> str:
    return f"{r.label} step {r.step}" if r.label else f"step {r.step}"


def _as_traced(records: list[RecordedStep]) -> list[_Traced]:
    return [_Traced("ok", r.attribution, _Job(step_name(r), r.batch, r.seq)) for r in records
            if r.attribution is not None]


def _bytes(n: int | None) -> str:
    return format_bytes(n) if n is not None else "–"


def logits_sentence(r: RecordedStep) -> tuple[str, str] | None:
    """(status, sentence) of the logits detector for one step, worded by what the user expects."""
    a = r.attribution
    if a is None or not r.vocab:
        return None
    status, sentence = logits_verdict(a, naive=r.fused is False)
    if status == "materialised" and r.fused is None:
        kept = next(t for t in a.large_tensors if t.kept_for_backward)
        shape = f" {tuple(kept.shape)}" if kept.shape else ""
        sentence = (f"the N×V logits are materialised in this step: {format_bytes(kept.bytes)} {kept.dtype}{shape} by "
                    f"{kept.op or 'an op'} in {kept.module} at {kept.source}, kept from the forward into the "
                    "backward — expected of the naive loss; a fused loss that is active never does this")
    return status, sentence


def pass_sentences(r: RecordedStep) -> list[str]:
    """What the evaluation passes before ``r`` did to the allocator's reserved memory."""
    passes = r.passes_before
    if not passes:
        return []
    measured = [p for p in passes if p.raised_reserved is not None]
    if not measured:
        kinds = ", ".join(sorted({p.kind for p in passes}))
        return [f"{step_name(r)}: {len(passes)} evaluation pass(es) ran before it ({kinds}); the reserved figure is "
                "unavailable on the CPU (no caching allocator), so whether they raised the reserved high-water mark is "
                "not known: record on the GPU to see it."]
    out = []
    raised = [p for p in measured if p.raised_reserved > max(RAISED_BYTES, 0.01 * (p.reserved_before or 0))]
    for p in raised:
        sentence = (f"{step_name(r)}: the {p.kind} before it (after {p.before_step} training steps) raised the "
                    f"allocator's reserved memory from {format_bytes(p.reserved_before)} to "
                    f"{format_bytes(p.reserved_after)} (+{format_bytes(p.raised_reserved)}; high-water mark "
                    f"{_bytes(p.max_reserved_after)}).")
        if r.reserved_at_start is not None and r.peak_reserved is not None:
            left = max(p.reserved_after or 0, p.max_reserved_after or 0)
            if r.reserved_at_start > left + RAISED_BYTES:
                sentence += (f" The training steps after it raised reserved further: this step began with "
                             f"{format_bytes(r.reserved_at_start)} reserved, so the {p.kind} does not set what "
                             "nvidia-smi shows here.")
            elif r.peak_reserved <= r.reserved_at_start + RAISED_BYTES:
                sentence += (f" The step began with {format_bytes(r.reserved_at_start)} reserved and never needed more "
                             f"(allocated peak {format_bytes(r.peak_allocated)}): nvidia-smi"
                             + (f" (≈ {format_bytes(r.smi_peak)})" if r.smi_peak is not None else "")
                             + f" shows what the {p.kind} left reserved, not what this step needs.")
            else:
                sentence += (f" The step itself then raised reserved further, to {format_bytes(r.peak_reserved)}: its "
                             "own peak, not the evaluation's, sets what nvidia-smi shows.")
        out.append(sentence)
    if not raised:
        kinds = ", ".join(f"{p.kind} (+{format_bytes(max(p.raised_reserved, 0))})" for p in measured)
        out.append(f"{step_name(r)}: the evaluation passes before it did not raise reserved memory noticeably: {kinds}.")
    return out


def _comparisons(records: list[RecordedStep]) -> list[str]:
    """The same step under different labels: what each label saves against the first one."""
    out = []
    by_step: dict[int, list[RecordedStep]] = {}
    for r in records:
        by_step.setdefault(r.step, []).append(r)
    for step, group in sorted(by_step.items()):
        labels = [r for r in group if r.label]
        if len({r.label for r in labels}) < 2:
            continue
        base = next((r for r in labels if r.fused is False), labels[0])
        for r in labels:
            if r is base or r.label == base.label:
                continue
            saving = base.peak_allocated - r.peak_allocated
            line = (f"step {step}: {r.label} peaks at {format_bytes(r.peak_allocated)} allocated against "
                    f"{base.label}'s {format_bytes(base.peak_allocated)}: {'saves' if saving >= 0 else 'adds'} "
                    f"{format_bytes(abs(saving))} ({format_percent(abs(saving) / base.peak_allocated)})")
            if r.smi_peak is not None and base.smi_peak is not None:
                line += (f"; nvidia-smi at the peak {format_bytes(r.smi_peak)} vs {format_bytes(base.smi_peak)} "
                         f"({format_bytes(base.smi_peak - r.smi_peak)} less)")
            if r.attribution is not None and base.attribution is not None:
                loss = base.attribution.group_bytes("LM-head/loss") - r.attribution.group_bytes("LM-head/loss")
                line += f"; of the saving at the traced peak, {format_bytes(loss)} is in the LM-head/loss kinds"
            out.append(line + ".")
    return out


def findings(records: list[RecordedStep]) -> list[str]:
    """Plain sentences computed from the records (see the module docstring)."""
    out = []
    for r in records:
        where = f"{r.batch}×{r.seq} tokens" if r.tokens else "batch shape not seen"
        precision = f", {r.autocast} autocast" if r.autocast else ""
        sentence = (f"{step_name(r)} ({r.model}, {where}{precision}, {r.device}): peak {format_bytes(r.peak_allocated)} "
                    f"allocated in the {r.peak_phase} phase")
        if r.peak_reserved is not None:
            sentence += (f"; reserved peak {format_bytes(r.peak_reserved)}, nvidia-smi at the peak ≈ "
                         f"{format_bytes(r.smi_peak)} (CUDA context and kernels {format_bytes(r.context)})")
        out.append(sentence + ".")
        verdict = logits_sentence(r)
        if verdict is not None:
            out.append(f"{step_name(r)}: logits detector — {verdict[1]}.")
        if r.attribution is not None and r.attribution.peak_bytes:
            a = r.attribution
            share = a.group_bytes("LM-head/loss") / a.peak_bytes
            out.append(f"{step_name(r)}: largest term at the peak — {largest_term(a)}; the LM head and loss hold "
                       f"{format_bytes(a.group_bytes('LM-head/loss'))} ({format_percent(share)}) of the traced peak.")
        if r.head is not None:
            h = r.head
            line = (f"{step_name(r)}: LM head {h['path']} ({h['found_by']}) multiplies by {h['weight']} "
                    f"({h['vocab']} × {h['hidden']})" + (", tied to the input embedding" if h.get("tied") else ", untied")
                    + ("; its forward ran in this step" if r.head_called else
                       "; its forward did not run in this step (the loss computed from the head's weight itself, as a "
                       "fused loss does)") + ".")
            out.append(" ".join([line] + list(h.get("notes") or [])))
        out += pass_sentences(r)
        out += [f"{step_name(r)}: {note}." for note in r.notes]
    return out + _comparisons(records)


def steps_table(records: list[RecordedStep]) -> pd.DataFrame:
    rows = []
    for r in records:
        verdict = logits_sentence(r)
        rows.append({
            "run": r.label or "–", "step": r.step, "B×T": f"{r.batch}×{r.seq}" if r.tokens else "–",
            "autocast": r.autocast or "–",
            "peak allocated": f"{format_bytes(r.peak_allocated)} ({r.peak_phase})",
            "peak reserved": _bytes(r.peak_reserved), "nvidia-smi at peak": _bytes(r.smi_peak),
            "reserved at start": _bytes(r.reserved_at_start),
            "LM-head/loss at peak": (_bytes(r.attribution.group_bytes("LM-head/loss")) if r.attribution else "–"),
            "logits": verdict[0] if verdict else "–", "step time": format_ms(r.time_ms),
        })
    return pd.DataFrame(rows)


def _step_phases(records: list[RecordedStep]) -> tuple[list[tuple[RecordedStep, object]], int]:
    """The last :data:`~fusedce_reports.plots.model.MAX_SHOWN_ROWS` (step, phase) pairs of
    ``records`` in order, and how many pairs there are in all."""
    pairs = [(r, p) for r in records for p in r.phases]
    return pairs[-MAX_SHOWN_ROWS:], len(pairs)


def phases_table(records: list[RecordedStep]) -> pd.DataFrame:
    """One row per phase of each step: the last :data:`~fusedce_reports.plots.model.MAX_SHOWN_ROWS`
    (the page says how many there are when that leaves some out)."""
    rows = []
    for r, p in _step_phases(records)[0]:
        rows.append({"run": step_name(r), "phase": p.name, "allocated at start": format_bytes(p.start_allocated),
                     "peak allocated": format_bytes(p.peak_allocated),
                     "allocated at end": format_bytes(p.end_allocated), "peak reserved": _bytes(p.peak_reserved),
                     "device used at end": _bytes(p.device_used_end)})
    return pd.DataFrame(rows)


def passes_table(records: list[RecordedStep]) -> pd.DataFrame:
    rows, seen = [], set()
    for r in records:
        for p in r.passes_before:
            key = (r.label, p.kind, p.before_step, p.reserved_before, p.reserved_after)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"run": r.label or "–", "pass": p.kind, "after training steps": p.before_step,
                         "reserved before": _bytes(p.reserved_before), "reserved after": _bytes(p.reserved_after),
                         "added": _bytes(p.raised_reserved), "high-water mark after": _bytes(p.max_reserved_after)})
    return pd.DataFrame(rows)


def plot_phases(records: list[RecordedStep], path: Path) -> Path | None:
    """Grouped bars: peak allocated (and reserved, on CUDA) of each phase of each recorded step —
    of the last :data:`~fusedce_reports.plots.model.MAX_SHOWN_ROWS` phases (the title says when
    that leaves some out), so the figure is at most ``0.5 × MAX_SHOWN_ROWS + 1.8`` inches tall."""
    if not records:
        return None
    pairs, total = _step_phases(records)
    unit, unit_name = (GIB, "GiB") if max(r.peak_allocated for r in records) >= GIB else (MIB, "MiB")
    fig, ax = new_figure((10, 0.5 * len(pairs) + 1.8))
    labels = []
    for y, (r, p) in enumerate(pairs):
        ax.barh(y, p.peak_allocated / unit, color="#1f77b4", label="peak allocated" if y == 0 else None)
        if p.peak_reserved is not None:
            ax.barh(y, p.peak_reserved / unit, color="#ff7f0e", alpha=0.35, label="peak reserved" if y == 0 else None)
        labels.append(plot_text(f"{step_name(r)}: {p.name}"))
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit_name} ({records[0].source})")
    ax.set_title("Recorded training steps: peak memory per phase"
                 + (f"\n(the last {len(pairs):,} of {total:,} phases)" if len(pairs) < total else ""))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _timeline_plots(folder: Path, records: list[RecordedStep], notes: list[str]) -> list[Path]:
    drawn = []
    for r in records:
        if not r.timeline:
            continue
        path = timeline_file(folder, r.timeline)
        if path is None:
            notes.append(f"{step_name(r)}: its timeline {r.timeline} is missing")
            continue
        try:
            timeline = read_timeline(path, folder)
        except ValueError as exc:
            notes.append(f"{path}: not a timeline ({str(exc).removeprefix(f'{path}: ')})")
            continue
        stem = path.name[: -len(store.TIMELINE_SUFFIX)]
        drawn.append(plot_timeline(timeline, folder / store.PLOTS_DIR / timeline_plot_name(stem),
                                   title=f"Memory timeline of {step_name(r)} (allocator snapshot)"))
    return drawn


def render_recorded_markdown(records: list[RecordedStep], environment: dict, plots: list[Path],
                             notes: list[str]) -> str:
    lines = ["# fusedce-profile: training steps recorded in your own run", ""]
    lines += [f"**Note.** {markdown_text(n)}" for n in notes] + ([""] if notes else [])
    if not records:
        return "\n".join(lines + ["No step was recorded.", ""])
    lines += [f"- {markdown_text(s)}" for s in findings(records)] + [""]  # stored strings in them: shown as text
    lines += ["## Recorded steps", "", markdown_table(steps_table(records)), ""]
    lines += ["## Phases", "",
              "forward: from the step's start; loss: from the final norm's output or the LM head's input; backward: "
              "from the `backward()` call; optimizer: from the optimizer's `step()` (explicit marks override).", ""]
    shown_phases, all_phases = _step_phases(records)
    if len(shown_phases) < all_phases:
        lines += [f"Showing {len(shown_phases):,} of these steps' {all_phases:,} phases: the last {len(shown_phases):,}; "
                  f"`{store.RECORDED_STEPS_FILE}` holds them all.", ""]
    lines += [markdown_table(phases_table(records)), ""]
    traced = _as_traced(records)
    if traced:
        lines += ["## Peak by module and kind (measured)", "",
                  "Every block alive at the recorded step's peak, classified by the module that allocated it "
                  "(backward allocations by the forward op that created their autograd node).", "",
                  markdown_table(attribution_table(traced)), ""]
        detected = detector_table(traced)
        if not detected.empty:
            lines += ["### Logits detector: allocations of at least N·V bytes", "",
                      "Kept for backward = allocated before `backward()` began and still alive after it: what "
                      "materialised logits do and a fused loss never does.", "", markdown_table(detected), ""]
    passes = passes_table(records)
    if not passes.empty:
        lines += ["## Evaluation passes before the recorded steps", "", markdown_table(passes), ""]
    lines += [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    snapshots = [r for r in records if r.snapshot]
    if snapshots:
        lines += ["Allocator snapshots (open in https://pytorch.org/memory_viz): "
                  + ", ".join(markdown_text(r.snapshot, line_start=False) for r in snapshots) + ".", ""]
    cuda = records[0].source == "cuda-allocator"
    lines += ["## How it was measured", "",
              "Recorded inside the training loop itself (`fusedce_profile`), on the steps named, with the user's own "
              "model, loss, precision and optimizer. "
              + ("Memory: the CUDA caching allocator's counters (peak allocated and reserved reset at each phase); "
                 "nvidia-smi = reserved + the CUDA context (`cudaMemGetInfo` − reserved after the step)."
                 if cuda else "Memory: the CPU allocator's events recorded by the PyTorch profiler (tensor bytes; no "
                              "reserved or nvidia-smi figures on the CPU)."), ""]
    lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment or {}), "") + [
        "</details>", ""]
    return "\n".join(lines)


@staging.all_or_nothing()  # the page and its plots together, or none (a full disk, a signal)
def write_recorded_report(folder: str | Path) -> Path:
    """Render ``summary.md`` and ``plots/`` from the folder's stored files; returns the summary's path."""
    folder = Path(folder)
    loaded = load_recorded_steps(folder)
    if loaded.missing:
        raise FileNotFoundError(f"{folder}: no {store.RECORDED_STEPS_FILE}")
    problems, unread = shown_rows(loaded.problems, "lines not read", store.RECORDED_STEPS_FILE)
    notes = [f"a line was not read: {p}" for p in problems] + ([unread] if unread else [])
    # every table, plot and finding below is of the last MAX_SHOWN_ROWS steps: a size that does not grow with the file
    records, left_out = shown_rows(loaded.records, "recorded steps", store.RECORDED_STEPS_FILE, keep="last")
    if left_out:
        notes.insert(0, left_out)
    plots = [p for p in (plot_phases(records, folder / store.PLOTS_DIR / "phases.png"),
                         plot_attribution(_as_traced(records), folder / store.PLOTS_DIR / "attribution.png")) if p]
    plots += _timeline_plots(folder, records, notes)
    text = render_recorded_markdown(records, read_environment(folder), plots, notes)
    return store.write_text(folder / "summary.md", text)
