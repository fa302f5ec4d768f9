"""The model mode's plots: bars of each back-end's training-step peak, from its results.

Each is a pair, as in the rest of :mod:`fusedce_reports.plots`, but of a list of
:class:`~fusedce_profiler.instrument.step.jobs.ModelResult` rather than a frame: ``draw_x(results)`` returns
the ``Figure`` (``None`` when nothing is to be drawn) and ``plot_x(results, path)`` writes it
as a PNG and returns the path. :func:`draw_breakdown` splits each peak into its composition,
:func:`draw_attribution` each traced peak by kind, :func:`draw_reserved` compares the
allocated peak with what the device shows.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from fusedce_profiler.instrument.step.jobs import ModelResult
from fusedce_profiler.instrument.tracing.attribution import KINDS
from fusedce_reports.attribution_tables import traced_results
from fusedce_reports.escape import plot_text
from fusedce_reports.palette import kind_colour
from fusedce_reports.figures import new_figure, save_figure
from fusedce_reports.units import GIB, format_bytes

DPI = 120

MAX_SHOWN_ROWS = 40
"""Most rows a model or recorded-steps report draws in one table or figure: jobs, recorded steps,
the phases of those steps, the bars of a plot. A real run has a handful (a back-end or two per model,
a few recorded steps), so nothing is left out of it; a stored file may hold 20,000 rows, and
drawing each (a bar of 0.55 inch, a table row, a paragraph of findings) made the report grow with
the file — 1,000 recorded steps took 57 s, 2.2 GB and a 12.6 MB PNG, 20,000 did not finish. Forty
bars make a figure at most 30 inches (3,600 pixels at 120 dpi) tall that can still be read, and forty
rows keep ``summary.md`` a page that fits in an issue; the rows left out are named on the page
(:func:`shown_rows`) and stay in the stored file."""


def shown_rows(rows: list, noun: str, where: str, *, keep: str = "first") -> tuple[list, str]:
    """At most :data:`MAX_SHOWN_ROWS` of ``rows`` — the ``first`` or the ``last`` ones — and the
    sentence the page shows when some were left out (``""`` when none was): "showing 40 of 1,600
    jobs: the first 40; model_results.jsonl holds them all"."""
    if len(rows) <= MAX_SHOWN_ROWS:
        return list(rows), ""
    kept = list(rows[:MAX_SHOWN_ROWS] if keep == "first" else rows[-MAX_SHOWN_ROWS:])
    return kept, f"showing {MAX_SHOWN_ROWS:,} of {len(rows):,} {noun}: the {keep} {MAX_SHOWN_ROWS:,}; {where} holds them all"


def _bounded(rows: list, title: str) -> tuple[list, str]:
    """A plot's own bound: its first :data:`MAX_SHOWN_ROWS` rows, and ``title`` saying so when
    it left some out (the reports pass rows already bounded by :func:`shown_rows`)."""
    if len(rows) <= MAX_SHOWN_ROWS:
        return rows, title
    return rows[:MAX_SHOWN_ROWS], f"{title}\n(the first {MAX_SHOWN_ROWS:,} of {len(rows):,})"

Draw = Callable[[list[ModelResult]], "Figure | None"]


def _saved(draw: Draw) -> Callable[[list[ModelResult], Path], Path | None]:
    """``plot_x(results, path)`` from ``draw_x(results)``: draw, write the PNG (cropped to what
    is drawn), return its path (``None``, and nothing written, when there is nothing to draw)."""
    def plot(results: list[ModelResult], path: Path) -> Path | None:
        fig = draw(results)
        return None if fig is None else save_figure(fig, path, dpi=DPI, bbox_inches="tight")

    plot.__name__ = plot.__qualname__ = draw.__name__.replace("draw_", "plot_", 1)
    plot.__module__ = draw.__module__
    plot.__doc__ = f"Save :func:`{draw.__name__}` as a PNG at ``path``; ``None`` when it draws nothing."
    return plot


Bar = tuple[str, list[tuple[str, float]], float]
"""One horizontal bar: its label, its (segment name, bytes) segments left to right, its total bytes."""


def _stacked_bars(bars: list[Bar], color: Callable[[str], object], *, height: float, xlabel: str, title: str,
                  legend_columns: int, headroom: float) -> Figure:
    """Horizontal stacked bars, one per row of ``bars``, each segment coloured by ``color(name)``
    and named once in the legend; the total is written at the bar's end. The axis is in GiB
    when the largest total reaches 1 GiB, else MiB (``xlabel`` is prefixed with the unit). At most
    :data:`MAX_SHOWN_ROWS` bars are drawn (the first ones; the title says so), so the figure is
    at most ``0.55 × MAX_SHOWN_ROWS + height`` inches tall."""
    bars, title = _bounded(bars, title)
    unit, unit_name = (GIB, "GiB") if max(total for _, _, total in bars) >= GIB else (1 << 20, "MiB")
    fig, ax = new_figure((10, 0.55 * len(bars) + height))
    labelled: set[str] = set()
    for i, (_, segments, total) in enumerate(bars):
        left = 0.0
        for name, size in segments:
            width = size / unit
            ax.barh(i, width, left=left, color=color(name), label=None if name in labelled else plot_text(name))
            labelled.add(name)
            left += width
        ax.text(left, i, f" {format_bytes(total)}", va="center", fontsize=9)
    ax.set_yticks(range(len(bars)), [plot_text(label) for label, _, _ in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, max(total for _, _, total in bars) / unit * headroom)
    ax.set_xlabel(f"{unit_name} {xlabel}")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(bars) + 3)), ncol=legend_columns,
              fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def draw_attribution(results: list[ModelResult]) -> Figure | None:
    """Horizontal stacked bars: each traced back-end's peak split by kind (``None`` when no
    result was traced)."""
    ok = traced_results(results)
    if not ok:
        return None
    kinds = [k for k in KINDS if any(r.attribution.kind_bytes(k) for r in ok)]
    bars = [(f"{r.job.label} (B={r.job.batch} T={r.job.seq})",
             [(kind, r.attribution.kind_bytes(kind)) for kind in kinds], r.attribution.peak_bytes) for r in ok]
    return _stacked_bars(bars, kind_colour, height=2.8,
                         xlabel="alive at the traced step's peak, by kind",
                         title="Measured attribution of the training step's peak", legend_columns=3, headroom=1.18)


plot_attribution = _saved(draw_attribution)


def draw_breakdown(results: list[ModelResult]) -> Figure | None:
    """Horizontal stacked bars: each back-end's peak split into its composition (``None`` when
    no result is ``ok``)."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return None
    bars = [(f"{r.job.label} ({r.job.config.name}{' tied' if r.job.config.tie_word_embeddings else ''}, "
             f"B={r.job.batch} T={r.job.seq})", [(p.name, p.bytes) for p in r.memory.composition], r.memory.peak)
            for r in ok]
    return _stacked_bars(bars, kind_colour, height=2.4,
                         xlabel=f"allocated at the step's peak ({ok[0].memory.source})",
                         title="Where the training step's peak memory goes", legend_columns=4, headroom=1.15)


plot_breakdown = _saved(draw_breakdown)


def draw_reserved(results: list[ModelResult]) -> Figure | None:
    """Allocated peak, reserved peak and nvidia-smi (reserved + context) per result (``None``
    without an nvidia-smi figure: CUDA only)."""
    ok = [r for r in results if r.status == "ok" and r.memory.smi_peak is not None]
    if not ok:
        return None
    ok, title = _bounded(ok, "Allocated vs what the device shows (an evaluation pass first: +eval)")
    fig, ax = new_figure((10, 0.7 * len(ok) + 2.0))
    series = (("allocated peak", "peak", "#1f77b4"), ("reserved peak", "peak_reserved", "#ff7f0e"),
              ("nvidia-smi (reserved + context)", "smi_peak", "#7f7f7f"))
    height = 0.8 / len(series)
    for k, (name, attr, colour) in enumerate(series):
        values = [getattr(r.memory, attr) / GIB for r in ok]
        ax.barh([i + (k - 1) * height for i in range(len(ok))], values, height=height, color=colour, label=name)
    ax.set_yticks(range(len(ok)), [plot_text(r.job.label) for r in ok])
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


plot_reserved = _saved(draw_reserved)
