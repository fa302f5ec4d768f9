"""Build every artefact of a run folder from its ``results.jsonl`` (and snapshots).

``build_report(run_dir)`` is what ``fusedce-profile report DIR`` calls and what a grid run
calls when it finishes; it needs no GPU and may be run again at any time: the files it
writes are pure functions of the run folder's results, environment and snapshots.

Layout of a run folder::

    results.jsonl       one CellResult per line (written by the profiler)
    environment.json    what ran it (written by the profiler / the CLI)
    snapshots/          memory snapshots (.pickle.gz), when recorded
    results.csv         ┐
    summary.md          │ written here
    report.html         │
    plots/*.png         ┘
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from profiler.records import CellResult
from reports import plots as plotting
from reports.environment import read_environment
from reports.findings import Finding, compute_findings
from reports.frame import results_frame
from reports.html import render_html
from reports.markdown import render_markdown
from reports.tables import CellTable, cell_tables, write_csv

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
PLOTS_DIR = "plots"

# (file stem, caption, drawing function); a function returning None draws nothing.
PLOTS = (
    ("peak_memory", "Peak memory vs tokens", plotting.plot_peak_memory),
    ("saving", "Memory saved vs torch", plotting.plot_saving),
    ("saving_heatmap", "Share of torch's peak saved, by head and tokens", plotting.plot_saving_heatmap),
    ("time", "Time vs tokens", plotting.plot_time),
    ("parity", "Parity vs the fp32 reference", plotting.plot_parity),
)


@dataclass
class Report:
    """What :func:`build_report` produced.

    ``frame``: the results frame (columns in :mod:`reports.frame`); ``parity_failed``: at
    least one cell exceeded its mode's tolerance; paths are absolute.
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

    @property
    def parity_failed(self) -> bool:
        return bool((self.frame.get("parity_ok", pd.Series(dtype=object)) == False).any())  # noqa: E712


def read_results(path: Path) -> list[CellResult]:
    """Every complete row of a ``results.jsonl``.

    A run killed while writing may leave a truncated last line: it is skipped with a
    warning. A malformed line anywhere else is an error naming the line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results file (expected the {RESULTS_FILE} a grid run writes)")
    lines = path.read_text(encoding="utf-8").splitlines()
    results = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            results.append(CellResult.from_json(line))
        except (ValueError, TypeError, KeyError) as exc:
            if number == len(lines):
                log.warning("%s:%d: skipping a truncated last line (%s)", path, number, exc)
                continue
            raise ValueError(f"{path}:{number}: not a results row: {exc}") from None
    return results


def _timeline(snapshot: Path, png: Path, title: str) -> Path:
    """Draw one snapshot's memory timeline with the profiler's offline drawing function."""
    from profiler.snapshot import load_snapshot, parse_timeline
    from profiler.timeline_plot import plot_timeline

    return Path(plot_timeline(parse_timeline(load_snapshot(snapshot)), png, title=title))


def _find_snapshot(run_dir: Path, recorded: str) -> Path | None:
    """The snapshot file a row names: as recorded, relative to the run folder, or by its
    name under ``snapshots/`` (a run folder that was moved, e.g. into ``examples/``)."""
    path = Path(recorded)
    for candidate in (path, run_dir / path, run_dir / "snapshots" / path.name):
        if candidate.is_file():
            return candidate
    return None


def _timelines(run_dir: Path, frame: pd.DataFrame, plots_dir: Path) -> list[tuple[str, Path]]:
    drawn = []
    for row in frame[frame["snapshot_path"].notna()].itertuples():
        snapshot = _find_snapshot(run_dir, row.snapshot_path)
        if snapshot is None:
            log.warning("snapshot %s listed in the results is missing", row.snapshot_path)
            continue
        stem = snapshot.name.split(".")[0]
        caption = f"Memory timeline: {row.backend}, {row.tokens} tokens, H={row.hidden} V={row.vocab}, {row.mode}"
        drawn.append((caption, _timeline(snapshot, plots_dir / f"timeline_{stem}.png", caption)))
    return drawn


def build_report(run_dir: Path) -> Report:
    """Write ``results.csv``, ``summary.md``, ``report.html`` and ``plots/`` into ``run_dir``."""
    run_dir = Path(run_dir).resolve()
    frame = results_frame(read_results(run_dir / RESULTS_FILE))
    environment = read_environment(run_dir)
    findings = compute_findings(frame)
    tables = cell_tables(frame)

    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    for stale in plots_dir.glob("*.png"):  # a rebuild must not keep plots that no longer apply
        stale.unlink()
    drawn: list[tuple[str, Path]] = []
    by_name: dict[str, Path] = {}
    if not frame.empty:
        for stem, caption, draw in PLOTS:
            path = draw(frame, plots_dir / f"{stem}.png")
            if path is not None:
                drawn.append((caption, path))
                by_name[stem] = path
    timelines = _timelines(run_dir, frame, plots_dir) if not frame.empty else []

    csv = write_csv(frame, run_dir / "results.csv")
    summary = run_dir / "summary.md"
    summary.write_text(render_markdown(frame, findings, tables, drawn, environment, plot_base=run_dir,
                                       timelines=timelines), encoding="utf-8")
    page = run_dir / "report.html"
    page.write_text(render_html(frame, findings, tables, drawn, environment, timelines), encoding="utf-8")
    return Report(run_dir, frame, findings, tables, csv, summary, page, by_name, [p for _, p in timelines])
