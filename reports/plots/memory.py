"""The memory plots of a grid report: peak vs tokens, saving vs tokens, the saving heatmap.

Each ``draw_*`` returns the :class:`~matplotlib.figure.Figure` (``None`` when the frame
holds nothing to draw) and each ``plot_*`` writes it as a PNG. Artists a reader (or a
test) looks for carry a ``gid``: ``backend:<name>`` for a back-end's line,
``oom:<name>`` for its out-of-memory markers, ``floor`` and ``logits`` for the reference
lines.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from fusedce_reports.escape import plot_text
from fusedce_reports.findings import headline_backend
from fusedce_reports.frame import BASELINE_BACKEND
from fusedce_reports.palette import backend_style
from fusedce_reports.plots.style import (backend_handles, bytes_axis, group_panels, legend, memory_label, panels, saved,
                                 styled, tokens_axis)
from fusedce_reports.units import format_bytes, format_tokens


@styled
def draw_peak_memory(frame: pd.DataFrame) -> Figure | None:
    """Peak extra bytes vs tokens per back-end, one panel per head; floor and logits lines,
    ``✕ OOM`` markers along the top edge at the sizes where a back-end ran out of memory."""
    drawable = frame[frame["status"].isin(["ok", "oom"])]
    if not (drawable["status"] == "ok").any():
        return None
    fig, backends, grouped = group_panels(drawable, "Peak memory of the loss step (forward + backward)")
    for ax, title, group in grouped:
        for backend in backends:
            style = backend_style(backend, backends)
            own = group[group["backend"] == backend]
            ok = own[own["status"] == "ok"].sort_values("tokens")
            if not ok.empty:
                ax.plot(ok["tokens"], ok["peak_bytes"], markersize=5, gid=f"backend:{backend}",
                        label=plot_text(backend), **style)
            oom = sorted(own.loc[own["status"] == "oom", "tokens"])
            if oom:
                ax.plot(oom, [0.94] * len(oom), transform=ax.get_xaxis_transform(), marker="X", markersize=9,
                        color=style["color"], linestyle="none", clip_on=False, zorder=4, gid=f"oom:{backend}")
            for tokens in oom:
                ax.annotate("OOM", (tokens, 0.94), xycoords=("data", "axes fraction"), xytext=(7, -3),
                            textcoords="offset points", fontsize=8, color=style["color"])
        sizes = group.drop_duplicates("tokens").sort_values("tokens")
        single = len(sizes) == 1  # a line needs two points: draw a level mark instead
        for column, gid, colour, linestyle in (("floor_bytes", "floor", "black", "--"),
                                               ("logits_bytes", "logits", "#999999", ":")):
            ax.plot(sizes["tokens"], sizes[column], color=colour, linestyle=linestyle, linewidth=1.3, zorder=1,
                    marker="_" if single else None, markersize=40, markeredgewidth=1.3, gid=gid)
        tokens_axis(ax, group["tokens"])
        bytes_axis(ax)
        bottom, top = ax.get_ylim()
        ax.set_ylim(bottom / 1.4, top * 1.8)  # head-room for the OOM markers
        ax.set_title(plot_text(title))
        ax.set_ylabel(memory_label((group["memory_source"] == "cpu-profiler").all()))
    handles = backend_handles(backends) + [
        Line2D([], [], color="black", linestyle="--", label="floor (gradients)"),
        Line2D([], [], color="#999999", linestyle=":", label="one copy of the logits"),
    ]
    if (drawable["status"] == "oom").any():
        handles.append(Line2D([], [], color="#555555", marker="X", linestyle="none", label="out of memory"))
    legend(fig, handles, ncol=min(len(handles), 5))
    return fig


def _spread(values: list[float], gap: float) -> list[float]:
    """Move sorted label positions apart so that neighbours are at least ``gap`` apart."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed = list(values)
    for previous, current in zip(order, order[1:]):
        placed[current] = max(placed[current], placed[previous] + gap)
    return placed


def _linear_tokens_axis(ax, tokens: pd.Series) -> None:
    """A linear tokens axis (a saving linear in B·T is a straight line), labels thinned so
    that small sizes crowded at the left do not overlap."""
    values = sorted(set(int(t) for t in tokens))
    ax.set_xticks(values)
    span = max(values[-1] - values[0], 1)
    labels, last = [], None
    for value in values:
        show = last is None or (value - last) / span > 0.07 or value == values[-1]
        labels.append(format_tokens(value) if show else "")
        last = value if show else last
    ax.set_xticklabels(labels)
    ax.set_xlabel("tokens N = B·T")
    ax.set_xlim(0, values[-1] * 1.18)  # from zero: the saving's proportionality shows; room for labels


@styled
def draw_saving(frame: pd.DataFrame) -> Figure | None:
    """Bytes saved vs the ``torch`` baseline against tokens (linear axes, so a saving that
    grows linearly with B·T is a straight line), per back-end, one panel per head; each
    back-end's share of torch's peak annotated at the largest size."""
    saved_rows = frame[frame["saving_bytes"].notna() & (frame["backend"] != BASELINE_BACKEND)]
    if saved_rows.empty:
        return None
    heading = f"Memory saved vs {BASELINE_BACKEND} (its peak minus the back-end's)"
    fig, backends, grouped = group_panels(saved_rows, heading)
    unit, unit_name = (1 << 30, "GiB") if saved_rows["saving_bytes"].abs().max() >= (1 << 30) else (1 << 20, "MiB")
    for ax, title, group in grouped:
        ends = []
        for backend in backends:
            own = group[group["backend"] == backend].sort_values("tokens")
            if own.empty:
                continue
            style = backend_style(backend, backends)
            ax.plot(own["tokens"], own["saving_bytes"] / unit, markersize=5, gid=f"backend:{backend}",
                    label=plot_text(backend), **style)
            last = own.iloc[-1]
            ends.append((last["tokens"], last["saving_bytes"] / unit, f"{100 * last['saving_frac']:.0f}%",
                         style["color"]))
        ax.axhline(0, color="black", linewidth=0.8)
        _linear_tokens_axis(ax, group["tokens"])
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, 0), high)
        gap = 0.06 * (high - min(low, 0))
        placed = _spread([y for _, y, _, _ in ends], gap=gap)
        ax.set_ylim(min(low, 0), max([high, *(y + gap / 2 for y in placed)]))
        for (x, y, text, colour), y_text in zip(ends, placed):
            ax.annotate(text, (x, y), xytext=(x * 1.02, y_text), textcoords="data", fontsize=8,
                        color=colour, va="center")
        ax.set_ylabel(f"saved ({unit_name})")
        ax.set_title(plot_text(title))
    legend(fig, backend_handles(backends))
    return fig


def _heatmap_cell(row: pd.Series, baseline_status: dict[str, str]) -> tuple[float, str]:
    """(share saved or NaN, label) of one heatmap cell."""
    if not np.isnan(row["saving_frac"]):
        return row["saving_frac"], f"{format_bytes(row['saving_bytes'])}\n{100 * row['saving_frac']:.0f}%"
    if row["status"] != "ok":
        return np.nan, row["status"]
    return np.nan, f"{BASELINE_BACKEND}\n{baseline_status.get(row['group'], 'not run')}"


@styled
def draw_saving_heatmap(frame: pd.DataFrame) -> Figure | None:
    """Share of torch's peak saved by the headline back-end over (head, tokens), one panel per
    mode; drawn only when the run covers at least two vocabulary sizes. Rows are heads
    (by V then H), columns token counts; unmeasured cells are NaN, labelled "not run"."""
    if frame["vocab"].nunique() < 2:
        return None
    hero = headline_backend(frame)
    if hero is None:
        return None
    own = frame[frame["backend"] == hero]
    baseline = frame[frame["backend"] == BASELINE_BACKEND]
    baseline_status = dict(zip(baseline["group"], baseline["status"]))
    grouped = list(own.groupby(["device", "mode", "options"], sort=False))
    fig, axes = panels(len(grouped), f"Share of {BASELINE_BACKEND}'s peak saved by {hero}")
    image = None
    for ax, ((device, mode, options), group) in zip(axes, grouped):
        heads = group.drop_duplicates(["vocab", "hidden"]).sort_values(["vocab", "hidden"])
        tokens = sorted(group["tokens"].unique())
        grid = np.full((len(heads), len(tokens)), np.nan)
        labels = [["not run" for _ in tokens] for _ in range(len(heads))]
        for i, head in enumerate(heads.itertuples()):
            for j, n in enumerate(tokens):
                cell = group[(group["hidden"] == head.hidden) & (group["vocab"] == head.vocab) & (group["tokens"] == n)]
                if not cell.empty:
                    grid[i, j], labels[i][j] = _heatmap_cell(cell.iloc[0], baseline_status)
        ax.set_facecolor("#eeeeee")  # cells not measured
        image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=1, aspect="auto", gid="saving")
        for i in range(len(heads)):
            for j in range(len(tokens)):
                dark = not np.isnan(grid[i, j]) and grid[i, j] > 0.6
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(tokens)), [format_tokens(int(t)) for t in tokens])
        ax.set_yticks(range(len(heads)), [f"V={h.vocab}\nH={h.hidden}" for h in heads.itertuples()])
        ax.set_xlabel("tokens N = B·T")
        ax.grid(False)
        ax.set_title(plot_text(" · ".join(p for p in (mode, device, options) if p)))
    fig.colorbar(image, ax=axes, fraction=0.04, pad=0.02, format=FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
    return fig


plot_peak_memory = saved(draw_peak_memory)
plot_saving = saved(draw_saving)
plot_saving_heatmap = saved(draw_saving_heatmap)
