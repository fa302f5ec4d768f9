"""``summary.md``: the report as Markdown, ready to paste into a GitHub issue.

Sections: headline counts, findings, one table per group of cells, the plots (relative
links into ``plots/``), how it was measured, and the environment in a collapsed block.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fusedce_reports.environment import environment_lines
from fusedce_reports.escape import code_block, link_target, markdown_text
from fusedce_reports.findings import Finding
from fusedce_reports.measurement import COLUMNS, memory_terms
from fusedce_reports.tables import CellTable
from fusedce_profiler.instrument.tolerances import TOLERANCES


OPEN_TIMELINES = 4
"""Up to this many memory timelines are shown open; more are folded into <details>."""


def markdown_table(rows: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of string cells, each shown as its text
    (:func:`~fusedce_reports.escape.markdown_text`; a :class:`~fusedce_reports.escape.Markdown` cell as it is)."""
    def cell(value: Any) -> str:
        return markdown_text(value, line_start=False)

    header = "| " + " | ".join(cell(c) for c in rows.columns) + " |"
    rule = "|" + "|".join("---" for _ in rows.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def headline(frame: pd.DataFrame) -> str:
    """``24 cells on cuda: 22 ok, 1 oom, 1 error; back-ends: torch, fusedce``."""
    from fusedce_reports.palette import ordered

    counts = frame["status"].value_counts()
    states = ", ".join(f"{int(counts[s])} {s}" for s in ("ok", "oom", "error", "skipped") if s in counts)
    devices = "/".join(sorted(set(frame["device"])))
    return f"{len(frame)} cells on {devices} ({states}); back-ends: {', '.join(ordered(frame['backend']))}."


def _image(caption: str, path: Path, base: Path) -> str:
    return f"![{markdown_text(caption)}]({link_target(Path(path).relative_to(base).as_posix())})"


def tolerance_sentence() -> str:
    modes = ", ".join(f"{mode} {tol:.0e}" for mode, tol in TOLERANCES.items())
    return f"Parity tolerances (relative error, per precision mode): {modes}."


def render_markdown(
    frame: pd.DataFrame,
    findings: Sequence[Finding],
    tables: Sequence[CellTable],
    plots: Sequence[tuple[str, Path]],
    environment: dict[str, Any],
    *,
    plot_base: Path,
    timelines: Sequence[tuple[str, Path]] = (),
    notes: Sequence[str] = (),
) -> str:
    """The whole ``summary.md``. ``plots`` and ``timelines`` are (caption, path) pairs;
    links are relative to ``plot_base`` (the folder ``summary.md`` is written to). More
    than :data:`OPEN_TIMELINES` timelines go into a collapsed block."""
    out = ["# fusedce-profile report", ""]
    if frame.empty:
        out += ["No cells were measured (the results file is empty).", ""]
    else:
        out += [markdown_text(headline(frame)), ""]
    if notes:
        out += ["**Incomplete or damaged run folder:**", ""] + [f"- {markdown_text(note)}" for note in notes] + [""]
    if findings:
        out += ["## Findings", ""]
        out += [f"- {f'**{markdown_text(f.scope)}**: ' if f.scope else ''}{markdown_text(f.text)}" for f in findings]
        out.append("")
    if tables:
        out += ["## Results", ""]
        for table in tables:
            out += [f"### {markdown_text(table.title)}", "", markdown_table(table.rows), ""]
    if plots:
        out += ["## Plots", ""]
        for caption, path in plots:
            out += [_image(caption, path, plot_base), ""]
    if timelines:
        out += ["## Memory timelines", ""]
        folded = len(timelines) > OPEN_TIMELINES
        if folded:
            out += [f"<details><summary>{len(timelines)} memory timelines</summary>", ""]
        for caption, path in timelines:
            out += [f"**{markdown_text(caption)}**", "", _image(caption, path, plot_base), ""]
        if folded:
            out += ["</details>", ""]
    out += ["## How it was measured", ""]
    out += [f"- **{term}**: {text}" for term, text in memory_terms(frame)]
    out += [f"- **{term}**: {text}" for term, text in COLUMNS]
    out += [f"- {tolerance_sentence()}", ""]
    out += ["<details><summary>Environment</summary>", ""]
    out += code_block(environment_lines(environment) or ["(no environment.json in the run folder)"])
    out += ["", "</details>", ""]
    return "\n".join(out)
