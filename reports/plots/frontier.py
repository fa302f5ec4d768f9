"""The time–memory frontier plot: one panel per head (:func:`fusedce_reports.frontier.frontiers`).

Each back-end is a point at (peak extra, median time) with its min–max time range as a
thin vertical bar; the frontier's points are ringed in black and joined from the lowest
memory to the highest; a back-end that failed parity is drawn hollow (it is never on the
frontier). The memory floor is a vertical dashed line, the time floor (when the frame has
one) a horizontal one. ``gid`` of the artists: ``point:<name>``, ``range:<name>``,
``frontier``, ``floor``, ``time-floor``.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fusedce_reports.escape import plot_text
from fusedce_reports.frontier import Frontier, frontiers
from fusedce_reports.palette import backend_style, ordered
from fusedce_reports.plots.style import backend_handles, bytes_axis, legend, memory_label, panels, saved, styled, time_axis
from fusedce_reports.units import format_tokens


def _draw_panel(ax, frontier: Frontier, backends: list[str]) -> None:
    for point in frontier.points:
        style = backend_style(point.backend, backends)
        colour = style["color"]
        ax.plot([point.peak_bytes], [point.timing.median_ms], linestyle="none", marker=style["marker"],
                markersize=10 if point.on_frontier else 7, color=colour,
                markerfacecolor="none" if point.parity_failed else colour,
                markeredgecolor="black" if point.on_frontier else colour,
                markeredgewidth=1.6 if point.on_frontier or point.parity_failed else 1.0,
                zorder=4 if point.on_frontier else 3, gid=f"point:{point.backend}", label=plot_text(point.backend))
        if point.timing.low_ms is not None and point.timing.high_ms is not None:
            ax.plot([point.peak_bytes] * 2, [point.timing.low_ms, point.timing.high_ms], color=colour,
                    linewidth=1.0, alpha=0.6, zorder=2, gid=f"range:{point.backend}")
        ax.annotate(plot_text(point.backend), (point.peak_bytes, point.timing.median_ms), xytext=(6, 4),
                    textcoords="offset points", fontsize=8, color=colour)
    pareto = frontier.pareto
    ax.plot([p.peak_bytes for p in pareto], [p.timing.median_ms for p in pareto], color="black", linewidth=1.2,
            linestyle="-", zorder=1, gid="frontier")
    if frontier.floor_bytes is not None:
        ax.axvline(frontier.floor_bytes, color="black", linestyle="--", linewidth=1.1, gid="floor")
    if frontier.time_floor_ms is not None:
        ax.axhline(frontier.time_floor_ms, color="#999999", linestyle="--", linewidth=1.1, gid="time-floor")
    bytes_axis(ax, "x")
    time_axis(ax, "y")
    left, right = ax.get_xlim()
    ax.set_xlim(left / 1.3, right * 1.6)  # room for the names beside the points
    ax.set_xlabel(memory_label(frontier.noisy))
    ax.set_ylabel("time (median" + (", CPU)" if frontier.noisy else ")"))
    ax.set_title(plot_text(f"{frontier.title} · {format_tokens(frontier.tokens)} tokens"))


@styled
def draw_frontier(frame: pd.DataFrame, every_size: bool = False) -> Figure | None:
    """Peak extra vs median time of every back-end, one panel per head at its largest size
    (a panel per size when there are few, or with ``every_size``), the Pareto frontier ringed and joined."""
    shown = frontiers(frame, every_size)
    if not shown:
        return None
    backends = ordered(p.backend for f in shown for p in f.points)
    fig, axes = panels(len(shown), "Time–memory frontier: no back-end on the line is beaten on both")
    for ax, frontier in zip(axes, shown):
        _draw_panel(ax, frontier, backends)
    handles = backend_handles(backends) + [
        Line2D([], [], color="black", marker="o", markerfacecolor="white", markeredgecolor="black",
               label="frontier (Pareto set)"),
        Line2D([], [], color="black", linestyle="--", label="floor (gradients)"),
    ]
    if any(f.time_floor_ms is not None for f in shown):
        handles.append(Line2D([], [], color="#999999", linestyle="--", label="time floor"))
    if any(p.parity_failed for f in shown for p in f.points):
        handles.append(Line2D([], [], color="#555555", marker="o", markerfacecolor="none", linestyle="none",
                              label="failed parity (hollow)"))
    legend(fig, handles, ncol=min(len(handles), 5))
    return fig


plot_frontier = saved(draw_frontier)
