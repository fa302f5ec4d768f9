"""Build every artefact of a grid run folder from its stored files.

``build_report(run_dir)`` is what ``fusedce-profile report DIR`` calls and what a grid run
calls when it finishes; it needs no GPU and may be run again at any time: what it writes is
a pure function of the folder's ``results.jsonl``, ``environment.json`` and
``snapshots/*.timeline.json``. It reads JSON only — never a pickle — so a folder received
from someone else cannot run code through it. Each file is written atomically (and, inside
:func:`~fusedce_profiler.instrument.staging.all_or_nothing`, the whole set at once); plots it
drew before and no longer draws are removed, and nothing else in the folder is touched.

Written here::

    results.csv      the results frame (:mod:`fusedce_reports.frame`)
    summary.md       Markdown, ready to paste into an issue
    report.html      self-contained HTML (plots embedded)
    plots/*.png      the plots (:mod:`fusedce_reports.plots`) and one timeline per snapshot
                     (:mod:`fusedce_reports.timeline`)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument import staging, store
from fusedce_profiler.grid.plan import planned_cells
from fusedce_profiler.instrument.records import load_results
from fusedce_profiler.instrument.text import resume_option
from fusedce_reports import plots as plotting
from fusedce_reports.environment import read_environment
from fusedce_reports.findings import Finding, compute_findings
from fusedce_reports.frame import results_frame
from fusedce_reports.html import render_html
from fusedce_reports.markdown import render_markdown
from fusedce_reports.tables import CellTable, cell_tables, write_csv
from fusedce_reports.timeline import (TIMELINE_PREFIX, plot_timeline, read_timeline, thinning_note, timeline_file,
                                      timeline_plot_name)

log = logging.getLogger(__name__)

MAX_PLOTTED_TOKEN_COUNTS = 64
"""Most distinct token counts the plots draw: a tick and a frontier point each; a folder of
thousands (a real grid has a few dozen) took minutes per plot."""

# (file stem, caption, drawing function); a function returning None draws nothing.
PLOTS = (
    ("peak_memory", "Peak memory vs tokens", plotting.plot_peak_memory),
    ("saving", "Memory saved vs torch", plotting.plot_saving),
    ("saving_heatmap", "Share of torch's peak saved, by head and tokens", plotting.plot_saving_heatmap),
    ("time", "Time vs tokens", plotting.plot_time),
    ("frontier", "Time–memory frontier per head", plotting.plot_frontier),
    ("parity", "Parity vs the fp32 reference", plotting.plot_parity),
)


@dataclass
class Report:
    """What :func:`build_report` produced.

    ``frame``: the results frame (columns in :mod:`fusedce_reports.frame`); ``notes``: what the
    report says about an incomplete or damaged folder; paths are absolute.
    """

    run_dir: Path
    frame: pd.DataFrame
    findings: list[Finding]
    tables: list[CellTable]
    csv: Path
    summary: Path
    html: Path
    plots: dict[str, Path] = field(default_factory=dict)
    timelines: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def parity_failed(self) -> bool:
        return bool((self.frame.get("parity_ok", pd.Series(dtype=object)) == False).any())  # noqa: E712


def _unfinished_plan(run_dir: Path, records) -> list[str]:
    """A note when the run finished fewer of the cells it planned (``plan.json``) than it set out to,
    or when its plan cannot be read (then whether it finished is unknown, and the note says so)."""
    try:
        planned = planned_cells(run_dir)
    except ValueError as exc:
        return [f"{exc}: whether the run measured every cell it planned is unknown"]
    if not planned:
        return []
    done = {r.spec.key() for r in records}
    finished = sum(spec.key() in done for spec in planned)
    if finished >= len(planned):
        return []
    return [f"{finished} of {len(planned)} cells — interrupted; continue with the same command and "
            f"`{resume_option(run_dir)}`"]


def _repeated_cells(loaded) -> list[str]:
    """A note for each cell that more than one line of ``results.jsonl`` holds (the last is reported)."""
    lines: dict[str, list[int]] = {}
    for record, number in zip(loaded.records, loaded.lines):
        lines.setdefault(record.spec.key(), []).append(number)
    return [f"{loaded.path}: lines {', '.join(map(str, numbers))} hold the same cell; the last, line {numbers[-1]}, "
            "is reported" for numbers in lines.values() if len(numbers) > 1]


def _stem(recorded: str) -> str:
    """``snapshots/<stem>.pickle`` or ``<stem>.timeline.json`` (or an older ``.pickle.gz``) → ``<stem>``."""
    name = Path(recorded).name
    for suffix in (store.TIMELINE_SUFFIX, store.SNAPSHOT_SUFFIX + ".gz", store.SNAPSHOT_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


def _timelines(run_dir: Path, frame: pd.DataFrame, plots_dir: Path, notes: list[str],
               kept: set[Path]) -> list[tuple[str, Path]]:
    """Draw the timeline of every row that has one; rows whose timeline file is missing keep the
    plot an earlier build drew (added to ``kept``) and get a note."""
    drawn = []
    has_timeline = frame["timeline_path"].notna() if "timeline_path" in frame else pd.Series(False, frame.index)
    for row in frame[has_timeline | frame["snapshot_path"].notna()].itertuples():
        path = timeline_file(run_dir, row.timeline_path)
        if path is None:
            recorded = row.timeline_path or row.snapshot_path
            kept.add(plots_dir / timeline_plot_name(_stem(recorded)))
            notes.append(f"timeline of {row.backend} at {row.tokens} tokens not redrawn: no timeline file for "
                         f"{recorded} in the folder (the report draws *.timeline.json files and never opens a "
                         "pickle)")
            continue
        try:
            timeline = read_timeline(path, run_dir)
        except ValueError as exc:
            notes.append(f"{path}: not a timeline ({str(exc).removeprefix(f'{path}: ')})")
            continue
        stem = _stem(path.name)
        caption = f"Memory timeline: {row.backend}, {row.tokens} tokens, H={row.hidden} V={row.vocab}, {row.mode}"
        path = plot_timeline(timeline, plots_dir / timeline_plot_name(stem), title=caption)
        drawn.append((f"{caption}; {thinning_note(timeline)}" if timeline.thinned_from else caption, path))
    return drawn


def _remove_stale_plots(plots_dir: Path, keep: set[Path]) -> None:
    """Remove the report's own plots (its stems, its timeline prefix) that this build did not draw."""
    own = {f"{stem}.png" for stem, _, _ in PLOTS}
    for path in plots_dir.glob("*.png"):
        if path.is_symlink() or not path.is_file() or path in keep:
            continue
        if path.name in own or path.name.startswith(TIMELINE_PREFIX):
            staging.remove(path)


def build_report(run_dir: Path) -> Report:
    """Write ``results.csv``, ``summary.md``, ``report.html`` and ``plots/`` into ``run_dir``.

    Raises ``FileNotFoundError`` when the folder has no ``results.jsonl``.
    """
    run_dir = Path(run_dir)
    loaded = load_results(run_dir)
    if loaded.missing:
        raise FileNotFoundError(f"{run_dir}: no {store.RESULTS_FILE} (expected the folder a grid run writes)")
    notes = list(loaded.problems) + _repeated_cells(loaded) + _unfinished_plan(run_dir, loaded.records)
    frame = results_frame(loaded.records)
    environment = read_environment(run_dir)
    findings = compute_findings(frame)
    tables = cell_tables(frame)

    plots_dir = run_dir / store.PLOTS_DIR
    if plots_dir.is_symlink():
        raise OSError(f"{plots_dir} is a symbolic link; the report writes its plots only inside the run folder")
    staging.make_folder(plots_dir)
    drawn: list[tuple[str, Path]] = []
    by_name: dict[str, Path] = {}
    token_counts = frame["tokens"].nunique() if not frame.empty else 0
    if token_counts > MAX_PLOTTED_TOKEN_COUNTS:
        notes.append(f"plots not drawn: {token_counts} token counts, more than the {MAX_PLOTTED_TOKEN_COUNTS} a "
                     "plot can show apart (the tables and results.csv hold every cell)")
    elif not frame.empty:
        for stem, caption, draw in PLOTS:
            path = draw(frame, plots_dir / f"{stem}.png")
            if path is not None:
                drawn.append((caption, path))
                by_name[stem] = path
    kept: set[Path] = set()
    timelines = _timelines(run_dir, frame, plots_dir, notes, kept) if not frame.empty else []
    _remove_stale_plots(plots_dir, {p for _, p in drawn} | {p for _, p in timelines} | kept)

    csv = write_csv(frame, run_dir / "results.csv")
    summary = store.write_text(run_dir / "summary.md", render_markdown(
        frame, findings, tables, drawn, environment, plot_base=run_dir, timelines=timelines, notes=notes))
    page = store.write_text(run_dir / "report.html", render_html(
        frame, findings, tables, drawn, environment, timelines, notes=notes))
    return Report(run_dir, frame, findings, tables, csv, summary, page, by_name, [p for _, p in timelines], notes)
