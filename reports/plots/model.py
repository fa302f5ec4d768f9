"""The model mode's plots: bars of each back-end's training-step peak, from its results.

Each is a pair, as in the rest of :mod:`reports.plots`, but of a list of
:class:`~profiler.training.jobs.ModelResult` rather than a frame: ``draw_x(results)`` returns
the ``Figure`` (``None`` when nothing is to be drawn) and ``plot_x(results, path)`` writes it
as a PNG and returns the path. :func:`draw_breakdown` splits each peak into its composition,
:func:`draw_attribution` each traced peak by kind, :func:`draw_reserved` compares the
allocated peak with what the device shows.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure

from profiler.training.jobs import ModelResult
from profiler.attribution import KINDS
from reports.attribution_tables import traced_results
from reports.escape import plot_text
from reports.figures import new_figure, save_figure
from reports.units import GIB, format_bytes

DPI = 120

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


def draw_attribution(results: list[ModelResult]) -> Figure | None:
    """Horizontal stacked bars: each traced back-end's peak split by kind (``None`` when no
    result was traced)."""
    ok = traced_results(results)
    if not ok:
        return None
    kinds = [k for k in KINDS if any(r.attribution.kind_bytes(k) for r in ok)]
    unit, unit_name = (GIB, "GiB") if max(r.attribution.peak_bytes for r in ok) >= GIB else (1 << 20, "MiB")
    cmap = colormaps["tab20"]
    fig, ax = new_figure((10, 0.55 * len(ok) + 2.8))
    for i, r in enumerate(ok):
        left = 0.0
        for j, kind in enumerate(kinds):
            width = r.attribution.kind_bytes(kind) / unit
            ax.barh(i, width, left=left, color=cmap(KINDS.index(kind) % 20),
                    label=plot_text(kind) if i == 0 else None)
            left += width
        ax.text(left, i, f" {format_bytes(r.attribution.peak_bytes)}", va="center", fontsize=9)
    ax.set_yticks(range(len(ok)), [plot_text(f"{r.job.label} (B={r.job.batch} T={r.job.seq})") for r in ok])
    ax.invert_yaxis()
    ax.set_xlim(0, max(r.attribution.peak_bytes for r in ok) / unit * 1.18)
    ax.set_xlabel(f"{unit_name} alive at the traced step's peak, by kind")
    ax.set_title("Measured attribution of the training step's peak")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(ok) + 3)), ncol=3, fontsize=8,
              frameon=False)
    fig.tight_layout()
    return fig


plot_attribution = _saved(draw_attribution)


def draw_breakdown(results: list[ModelResult]) -> Figure | None:
    """Horizontal stacked bars: each back-end's peak split into its composition (``None`` when
    no result is ``ok``)."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return None
    part_names: list[str] = []
    for r in ok:
        for p in r.memory.composition:
            if p.name not in part_names:
                part_names.append(p.name)
    unit, unit_name = (GIB, "GiB") if max(r.memory.peak for r in ok) >= GIB else (1 << 20, "MiB")
    cmap = colormaps["tab10"]
    fig, ax = new_figure((10, 0.55 * len(ok) + 2.4))
    labels = [f"{r.job.label} ({r.job.config.name}{' tied' if r.job.config.tie_word_embeddings else ''}, "
              f"B={r.job.batch} T={r.job.seq})" for r in ok]
    labelled: set[str] = set()
    for i, r in enumerate(ok):
        left = 0.0
        for p in r.memory.composition:
            width = p.bytes / unit
            ax.barh(i, width, left=left, color=cmap(part_names.index(p.name) % 10),
                    label=None if p.name in labelled else plot_text(p.name))
            labelled.add(p.name)
            left += width
        ax.text(left, i, f" {format_bytes(r.memory.peak)}", va="center", fontsize=9)
    ax.set_yticks(range(len(ok)), [plot_text(label) for label in labels])
    ax.invert_yaxis()
    ax.set_xlim(0, max(r.memory.peak for r in ok) / unit * 1.15)
    ax.set_xlabel(f"{unit_name} allocated at the step's peak ({ok[0].memory.source})")
    ax.set_title("Where the training step's peak memory goes")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(ok) + 3)), ncol=4, fontsize=8,
              frameon=False)
    fig.tight_layout()
    return fig


plot_breakdown = _saved(draw_breakdown)


def draw_reserved(results: list[ModelResult]) -> Figure | None:
    """Allocated peak, reserved peak and nvidia-smi (reserved + context) per result (``None``
    without an nvidia-smi figure: CUDA only)."""
    ok = [r for r in results if r.status == "ok" and r.memory.smi_peak is not None]
    if not ok:
        return None
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
    ax.set_title("Allocated vs what the device shows (an evaluation pass first: +eval)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


plot_reserved = _saved(draw_reserved)
