"""What every grid plot shares: the figure style, panel layout, axes and legend.

Figures are drawn on matplotlib's Agg canvas directly (:mod:`fusedce_reports.figures`): no pyplot
state, no display, the caller's settings kept; :data:`STYLE` applies only while a plot is
drawn and saved. Back-ends keep their colour and marker across every plot
(:mod:`fusedce_reports.palette`). Axes of bytes and tokens are base-2 logarithmic, so every
doubling is one step.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, Locator, LogLocator, NullFormatter

from fusedce_reports.escape import plot_text
from fusedce_reports.figures import new_figure, save_figure
from fusedce_reports.palette import backend_style, ordered
from fusedce_reports.tables import group_title
from fusedce_reports.units import format_bytes, format_ms, format_tokens

WIDTH_IN = 9.0
DPI = 130
PANEL_HEIGHT_IN = 3.3
GROUP_KEYS = ["device", "mode", "hidden", "vocab", "options"]

STYLE = {
    "font.size": 9.5, "axes.titlesize": 10, "axes.labelsize": 9.5, "legend.fontsize": 8.5,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
}

Draw = Callable[[pd.DataFrame], "Figure | None"]


def styled(draw: Draw) -> Draw:
    """Draw under :data:`STYLE` without touching the caller's matplotlib settings."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


def saved(draw: Draw) -> Callable[[pd.DataFrame, Path], Path | None]:
    """``plot_x(frame, path)`` from ``draw_x(frame)``: draw, write the PNG, return its path
    (``None``, and nothing written, when there is nothing to draw)."""
    def plot(frame: pd.DataFrame, path: Path) -> Path | None:
        with matplotlib.rc_context(STYLE):
            fig = draw(frame)
            return None if fig is None else save_figure(fig, path, dpi=DPI)

    plot.__name__ = plot.__qualname__ = draw.__name__.replace("draw_", "plot_", 1)
    plot.__module__ = draw.__module__
    plot.__doc__ = f"Save :func:`{draw.__name__}` as a PNG at ``path``; ``None`` when it draws nothing."
    return plot


def groups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per group of comparable cells (same device, mode, head, options)."""
    return [(group_title(d, m, int(h), int(v), o), g)
            for (d, m, h, v, o), g in frame.groupby(GROUP_KEYS, sort=False)]


def panels(count: int, title: str) -> tuple[Figure, list[Axes]]:
    """A figure of ``count`` panels, two per row, at GitHub's column width."""
    columns = min(count, 2)
    rows = math.ceil(count / columns)
    fig, axes = new_figure((WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * rows), rows, columns, squeeze=False)
    fig.set_layout_engine("constrained")
    flat = list(axes.flat)
    for extra in flat[count:]:
        extra.set_visible(False)
    fig.suptitle(plot_text(title), fontsize=12, fontweight="bold")
    return fig, flat[:count]


def group_panels(rows: pd.DataFrame, title: str) -> tuple[Figure, list[str], list[tuple[Axes, str, pd.DataFrame]]]:
    """A panel per group of ``rows`` (:func:`groups`): the figure, every back-end of ``rows``
    in report order (for consistent styles), and (axes, group title, group rows) per panel."""
    grouped = groups(rows)
    fig, axes = panels(len(grouped), title)
    return fig, ordered(rows["backend"]), [(ax, name, group) for ax, (name, group) in zip(axes, grouped)]


def tokens_axis(ax: Axes, tokens: pd.Series) -> None:
    """A base-2 logarithmic tokens axis with a tick at every size measured."""
    ax.set_xscale("log", base=2)
    values = sorted(set(int(t) for t in tokens))
    ax.set_xticks(values)
    ax.set_xticklabels([format_tokens(t) for t in values])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens N = B·T")
    if len(values) == 1:
        ax.set_xlim(values[0] / 1.6, values[0] * 1.6)


def tick_bytes(y: float) -> str:
    """Tick labels on a base-2 axis: ``4 GiB``, ``512 MiB`` (no trailing zeros)."""
    text = format_bytes(y)
    number, unit = text.split(" ") if " " in text else (text, "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}".strip()


def _axis(ax: Axes, which: str, scale: str, **kwargs):
    (ax.set_xscale if which == "x" else ax.set_yscale)(scale, **kwargs)
    return ax.xaxis if which == "x" else ax.yaxis


def bytes_axis(ax: Axes, which: str = "y") -> None:
    """A base-2 logarithmic bytes axis (``which``: "x" or "y")."""
    axis = _axis(ax, which, "log", base=2)
    axis.set_major_locator(LogLocator(base=2))
    axis.set_major_formatter(FuncFormatter(lambda y, _: tick_bytes(y)))
    axis.set_minor_formatter(NullFormatter())


class ReadableLogLocator(Locator):
    """Major ticks of a log axis at readable values, dense enough that at least four fall in
    the view: 1-2-5 per decade over several decades, then 1-2-3-5, then 1-1.5-2-3-4-5-6-8,
    then steps of 0.5 (an axis from 2.9 s to 3.8 s gets 3 s and 3.5 s), then of 0.1."""

    STEPS = ((1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0),
             tuple(x / 2 for x in range(2, 20)), tuple(x / 10 for x in range(10, 100)))

    def __call__(self) -> list[float]:
        low, high = sorted(self.axis.get_view_interval())
        return self.tick_values(low, high)

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        low, high = max(min(vmin, vmax), 1e-300), max(vmin, vmax, 1e-300)
        decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
        ticks: list[float] = []
        for subs in self.STEPS:
            ticks = [sub * 10.0 ** d for d in decades for sub in subs]
            if sum(low <= t <= high for t in ticks) >= 4:
                break
        return ticks


def time_axis(ax: Axes, which: str = "y") -> None:
    """A decimal logarithmic time axis labelled in ms / s at readable values
    (:class:`ReadableLogLocator`; ``which``: "x" or "y")."""
    axis = _axis(ax, which, "log")
    axis.set_major_locator(ReadableLogLocator())
    axis.set_major_formatter(FuncFormatter(lambda y, _: format_ms(y)))
    axis.set_minor_formatter(NullFormatter())


def legend(fig: Figure, handles: list, ncol: int | None = None) -> None:
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol or min(len(handles), 6), frameon=False)


def backend_handles(backends: list[str]) -> list[Line2D]:
    """One legend entry per back-end, in its colour and marker."""
    return [Line2D([], [], label=plot_text(b), **{k: v for k, v in backend_style(b, backends).items() if k != "zorder"})
            for b in backends]


def memory_label(cpu: bool) -> str:
    """The label of a peak-extra axis: the CPU's accounting or the CUDA allocator's."""
    return "peak extra (CPU accounting)" if cpu else "peak extra (allocated)"
