"""The time plot of a grid report: median forward + backward time vs tokens per back-end.

:func:`draw_time` returns the figure (a back-end's error-bar line carries the ``gid``
``backend:<name>``), :func:`plot_time` writes it as a PNG.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from fusedce_reports.escape import plot_text
from fusedce_reports.palette import backend_style
from fusedce_reports.plots.style import backend_handles, group_panels, legend, saved, styled, time_axis, tokens_axis


@styled
def draw_time(frame: pd.DataFrame) -> Figure | None:
    """Median forward+backward time vs tokens per back-end (log-log, min–max as error bars)."""
    timed = frame[(frame["status"] == "ok") & frame["time_ms"].notna()]
    if timed.empty:
        return None
    fig, backends, grouped = group_panels(timed, "Time of one forward + backward (median)")
    for ax, title, group in grouped:
        for backend in backends:
            own = group[group["backend"] == backend].sort_values("tokens")
            if own.empty:
                continue
            style = backend_style(backend, backends)
            low = (own["time_ms"] - own["time_ms_min"]).clip(lower=0).fillna(0)
            high = (own["time_ms_max"] - own["time_ms"]).clip(lower=0).fillna(0)
            bars = ax.errorbar(own["tokens"], own["time_ms"], yerr=[low, high], markersize=5, capsize=2,
                               label=plot_text(backend), **style)
            bars.lines[0].set_gid(f"backend:{backend}")
        tokens_axis(ax, group["tokens"])
        time_axis(ax)
        ax.set_ylabel("time" + (" (CPU)" if group["device"].iloc[0] == "cpu" else ""))
        ax.set_title(plot_text(title))
    legend(fig, backend_handles(backends))
    return fig


plot_time = saved(draw_time)
