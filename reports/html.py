"""``report.html``: one self-contained page (inline CSS, plots embedded as base64 PNG).

It loads nothing from the network, so it opens offline and can be attached to an issue.
"""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fusedce_profiler.instrument import staging
from fusedce_profiler.instrument.text import capped
from fusedce_reports.environment import environment_lines
from fusedce_reports.findings import Finding
from fusedce_reports.markdown import headline, tolerance_sentence
from fusedce_reports.measurement import COLUMNS, memory_terms
from fusedce_reports.tables import CellTable

_STYLE = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328;
       max-width: 1000px; margin: 2em auto; padding: 0 1em; }
h1 { border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 9px; text-align: right; }
th { background: #f6f8fa; }
td:first-child, th:first-child, td:last-child { text-align: left; }
tr.fusedce td { font-weight: 600; }
td.fail { color: #cf222e; font-weight: 600; }
img { max-width: 100%; border: 1px solid #eee; margin: .4em 0 1em; }
pre { background: #f6f8fa; padding: 1em; overflow-x: auto; font-size: 12.5px; }
code { background: #f6f8fa; padding: 0 .25em; }
"""


def _esc(value: Any) -> str:
    """``value`` as HTML text, each line at most :data:`~fusedce_profiler.instrument.text.MAX_SHOWN_CHARS`
    characters (:func:`~fusedce_profiler.instrument.text.capped`)."""
    return html.escape(capped(str(value)))


def _inline(text: str) -> str:
    """Escape ``text`` and turn Markdown-style `code` spans into <code>."""
    parts = _esc(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def html_table(rows: pd.DataFrame) -> str:
    """An HTML table of string cells; the fusedce rows emphasised, failed parity in red."""
    head = "".join(f"<th>{_esc(c)}</th>" for c in rows.columns)
    body = []
    for row in rows.itertuples(index=False):
        css = ' class="fusedce"' if row[0] == "fusedce" else ""
        cells = "".join(
            f'<td class="fail">{_esc(v)}</td>' if "✗" in str(v) else f"<td>{_esc(v)}</td>" for v in row
        )
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def embedded_png(path: Path) -> str:
    """``data:`` URI of a PNG file (its newest content: a plot this report drew may not be in
    place yet, :func:`~fusedce_profiler.instrument.staging.newest`)."""
    return "data:image/png;base64," + base64.b64encode(staging.newest(path).read_bytes()).decode("ascii")


def render_html(
    frame: pd.DataFrame,
    findings: Sequence[Finding],
    tables: Sequence[CellTable],
    plots: Sequence[tuple[str, Path]],
    environment: dict[str, Any],
    timelines: Sequence[tuple[str, Path]] = (),
    notes: Sequence[str] = (),
) -> str:
    """The whole ``report.html`` as a string (timelines in a collapsed section)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>fusedce-profile report</title>", f"<style>{_STYLE}</style></head><body>",
           "<h1>fusedce-profile report</h1>"]
    out.append(f"<p>{_esc(headline(frame)) if not frame.empty else 'No cells were measured.'}</p>")
    if notes:
        out.append("<p><b>Incomplete or damaged run folder:</b></p><ul>")
        out += [f"<li>{_esc(note)}</li>" for note in notes]
        out.append("</ul>")
    if findings:
        out.append("<h2>Findings</h2><ul>")
        out += [f"<li>{f'<b>{_esc(f.scope)}</b>: ' if f.scope else ''}{_esc(f.text)}</li>" for f in findings]
        out.append("</ul>")
    if tables:
        out.append("<h2>Results</h2>")
        for table in tables:
            out += [f"<h3>{_esc(table.title)}</h3>", html_table(table.rows)]
    if plots:
        out.append("<h2>Plots</h2>")
        out += [f'<figure><img alt="{_esc(caption)}" src="{embedded_png(path)}"></figure>' for caption, path in plots]
    if timelines:
        out.append(f"<h2>Memory timelines</h2><details><summary>{len(timelines)} timelines</summary>")
        out += [f'<figure><figcaption>{_esc(caption)}</figcaption><img alt="{_esc(caption)}" '
                f'src="{embedded_png(path)}"></figure>' for caption, path in timelines]
        out.append("</details>")
    out.append("<h2>How it was measured</h2><ul>")
    out += [f"<li><b>{_esc(term)}</b>: {_inline(text)}</li>" for term, text in (*memory_terms(frame), *COLUMNS)]
    out.append(f"<li>{_esc(tolerance_sentence())}</li></ul>")
    lines = environment_lines(environment) or ["(no environment.json in the run folder)"]
    out.append("<h2>Environment</h2><pre>" + _esc("\n".join(lines)) + "</pre>")
    out.append("</body></html>")
    return "\n".join(out)
