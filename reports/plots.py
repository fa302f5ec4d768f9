"""PNG plots of a results frame, sized for GitHub's ~900 px column.

Each function draws one figure from the frame, writes it to ``path`` and returns the path,
or returns ``None`` when the frame holds nothing to draw (e.g. no timed cells). Back-ends
keep their colour and marker across every plot (:mod:`reports.palette`). Axes of bytes and
tokens are base-2 logarithmic, so every doubling of B·T is one step (the saving plot is
linear, so that a saving proportional to B·T is a straight line). Figures are drawn on
matplotlib's Agg canvas directly: no pyplot state, no display, the caller's settings kept.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from reports.figures import save_figure
from reports.findings import headline_backend
from reports.frame import BASELINE_BACKEND
from reports.palette import backend_style, ordered
from reports.tables import group_title
from reports.units import format_bytes, format_error, format_ms, format_tokens

WIDTH_IN = 9.0
DPI = 130
PANEL_HEIGHT_IN = 3.3
GROUP_KEYS = ["device", "mode", "hidden", "vocab", "options"]
QUANTITIES = (("err_loss", "loss", "o"), ("err_grad_hidden", "grad hidden", "s"),
              ("err_grad_weight", "grad weight", "^"), ("err_grad_bias", "grad bias", "D"))

STYLE = {
    "font.size": 9.5, "axes.titlesize": 10, "axes.labelsize": 9.5, "legend.fontsize": 8.5,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
}


def _styled(draw):
    """Draw under :data:`STYLE` without touching the caller's matplotlib settings."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


def _groups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(group_title(d, m, int(h), int(v), o), g)
            for (d, m, h, v, o), g in frame.groupby(GROUP_KEYS, sort=False)]


def _panels(count: int, title: str) -> tuple[Figure, list[Axes]]:
    columns = min(count, 2)
    rows = math.ceil(count / columns)
    fig = Figure(figsize=(WIDTH_IN, 1.0 + PANEL_HEIGHT_IN * rows), layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg, whatever pyplot's backend is
    axes = fig.subplots(rows, columns, squeeze=False)
    flat = list(axes.flat)
    for extra in flat[count:]:
        extra.set_visible(False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, flat[:count]


def _tokens_axis(ax: Axes, tokens: pd.Series) -> None:
    ax.set_xscale("log", base=2)
    values = sorted(set(int(t) for t in tokens))
    ax.set_xticks(values)
    ax.set_xticklabels([format_tokens(t) for t in values])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens N = B·T")
    if len(values) == 1:
        ax.set_xlim(values[0] / 1.6, values[0] * 1.6)


def _tick_bytes(y: float) -> str:
    """Tick labels on a base-2 axis: ``4 GiB``, ``512 MiB`` (no trailing zeros)."""
    text = format_bytes(y)
    number, unit = text.split(" ") if " " in text else (text, "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}".strip()


def _bytes_axis(ax: Axes) -> None:
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _tick_bytes(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _legend(fig: Figure, handles: list, ncol: int | None = None) -> None:
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol or min(len(handles), 6), frameon=False)


def _backend_handles(backends: list[str]) -> list[Line2D]:
    return [Line2D([], [], label=b, **{k: v for k, v in backend_style(b, backends).items() if k != "zorder"})
            for b in backends]


def _save(fig: Figure, path: Path) -> Path:
    return save_figure(fig, path, dpi=DPI)


def _memory_label(frame: pd.DataFrame) -> str:
    return "peak extra (CPU accounting)" if (frame["memory_source"] == "cpu-profiler").all() else "peak extra (allocated)"


@_styled
def plot_peak_memory(frame: pd.DataFrame, path: Path) -> Path | None:
    """Peak extra bytes vs tokens per back-end, one panel per head; floor and logits lines,
    ``✕ OOM`` markers along the top edge at the sizes where a back-end ran out of memory."""
    drawable = frame[frame["status"].isin(["ok", "oom"])]
    if not (drawable["status"] == "ok").any():
        return None
    backends = ordered(drawable["backend"])
    groups = _groups(drawable)
    fig, axes = _panels(len(groups), "Peak memory of the loss step (forward + backward)")
    for ax, (title, group) in zip(axes, groups):
        for backend in backends:
            style = backend_style(backend, backends)
            own = group[group["backend"] == backend]
            ok = own[own["status"] == "ok"].sort_values("tokens")
            if not ok.empty:
                ax.plot(ok["tokens"], ok["peak_bytes"], markersize=5, **style)
            for tokens in own.loc[own["status"] == "oom", "tokens"]:
                ax.plot([tokens], [0.94], transform=ax.get_xaxis_transform(), marker="X", markersize=9,
                        color=style["color"], linestyle="none", clip_on=False, zorder=4)
                ax.annotate("OOM", (tokens, 0.94), xycoords=("data", "axes fraction"), xytext=(7, -3),
                            textcoords="offset points", fontsize=8, color=style["color"])
        sizes = group.drop_duplicates("tokens").sort_values("tokens")
        single = len(sizes) == 1  # a line needs two points: draw a level mark instead
        for column, colour, linestyle in (("floor_bytes", "black", "--"), ("logits_bytes", "#999999", ":")):
            ax.plot(sizes["tokens"], sizes[column], color=colour, linestyle=linestyle, linewidth=1.3, zorder=1,
                    marker="_" if single else None, markersize=40, markeredgewidth=1.3)
        _tokens_axis(ax, group["tokens"])
        _bytes_axis(ax)
        bottom, top = ax.get_ylim()
        ax.set_ylim(bottom / 1.4, top * 1.8)  # head-room for the OOM markers
        ax.set_title(title)
        ax.set_ylabel(_memory_label(group))
    handles = _backend_handles(backends) + [
        Line2D([], [], color="black", linestyle="--", label="floor (gradients)"),
        Line2D([], [], color="#999999", linestyle=":", label="one copy of the logits"),
    ]
    if (drawable["status"] == "oom").any():
        handles.append(Line2D([], [], color="#555555", marker="X", linestyle="none", label="out of memory"))
    _legend(fig, handles, ncol=min(len(handles), 5))
    return _save(fig, path)


def _spread(values: list[float], gap: float) -> list[float]:
    """Move sorted label positions apart so that neighbours are at least ``gap`` apart."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed = list(values)
    for previous, current in zip(order, order[1:]):
        placed[current] = max(placed[current], placed[previous] + gap)
    return placed


def _linear_tokens_axis(ax: Axes, tokens: pd.Series) -> None:
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


@_styled
def plot_saving(frame: pd.DataFrame, path: Path) -> Path | None:
    """Bytes saved vs the ``torch`` baseline against tokens (linear axes, so a saving that
    grows linearly with B·T is a straight line), per back-end, one panel per head; each
    back-end's share of torch's peak annotated at the largest size."""
    saved = frame[frame["saving_bytes"].notna() & (frame["backend"] != BASELINE_BACKEND)]
    if saved.empty:
        return None
    backends = ordered(saved["backend"])
    groups = _groups(saved)
    fig, axes = _panels(len(groups), f"Memory saved vs {BASELINE_BACKEND} (its peak minus the back-end's)")
    unit, unit_name = (1 << 30, "GiB") if saved["saving_bytes"].abs().max() >= (1 << 30) else (1 << 20, "MiB")
    for ax, (title, group) in zip(axes, groups):
        ends = []
        for backend in backends:
            own = group[group["backend"] == backend].sort_values("tokens")
            if own.empty:
                continue
            style = backend_style(backend, backends)
            ax.plot(own["tokens"], own["saving_bytes"] / unit, markersize=5, **style)
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
        ax.set_title(title)
    _legend(fig, _backend_handles(backends))
    return _save(fig, path)


@_styled
def plot_saving_heatmap(frame: pd.DataFrame, path: Path) -> Path | None:
    """Share of torch's peak saved by the headline back-end over (head, tokens), one panel per
    mode; drawn only when the run covers at least two vocabulary sizes."""
    if frame["vocab"].nunique() < 2:
        return None
    hero = headline_backend(frame)
    if hero is None:
        return None
    own = frame[frame["backend"] == hero]
    baseline = frame[frame["backend"] == BASELINE_BACKEND]
    baseline_status = dict(zip(baseline["group"], baseline["status"]))
    panels = list(own.groupby(["device", "mode", "options"], sort=False))
    fig, axes = _panels(len(panels), f"Share of {BASELINE_BACKEND}'s peak saved by {hero}")
    image = None
    for ax, ((device, mode, options), group) in zip(axes, panels):
        heads = group.drop_duplicates(["vocab", "hidden"]).sort_values(["vocab", "hidden"])
        tokens = sorted(group["tokens"].unique())
        grid = np.full((len(heads), len(tokens)), np.nan)
        labels = [["" for _ in tokens] for _ in range(len(heads))]
        for i, head in enumerate(heads.itertuples()):
            for j, n in enumerate(tokens):
                cell = group[(group["hidden"] == head.hidden) & (group["vocab"] == head.vocab) & (group["tokens"] == n)]
                if cell.empty:
                    labels[i][j] = "not run"
                    continue
                row = cell.iloc[0]
                if not np.isnan(row["saving_frac"]):
                    grid[i, j] = row["saving_frac"]
                    labels[i][j] = f"{format_bytes(row['saving_bytes'])}\n{100 * row['saving_frac']:.0f}%"
                elif row["status"] != "ok":
                    labels[i][j] = row["status"]
                else:
                    labels[i][j] = f"{BASELINE_BACKEND}\n{baseline_status.get(row['group'], 'not run')}"
        ax.set_facecolor("#eeeeee")  # cells not measured
        image = ax.imshow(grid, cmap="Blues", vmin=0, vmax=1, aspect="auto")
        for i in range(len(heads)):
            for j in range(len(tokens)):
                dark = not np.isnan(grid[i, j]) and grid[i, j] > 0.6
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(tokens)), [format_tokens(int(t)) for t in tokens])
        ax.set_yticks(range(len(heads)), [f"V={h.vocab}\nH={h.hidden}" for h in heads.itertuples()])
        ax.set_xlabel("tokens N = B·T")
        ax.grid(False)
        ax.set_title(" · ".join(p for p in (mode, device, options) if p))
    fig.colorbar(image, ax=axes, fraction=0.04, pad=0.02, format=FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
    return _save(fig, path)


@_styled
def plot_time(frame: pd.DataFrame, path: Path) -> Path | None:
    """Median forward+backward time vs tokens per back-end (log-log, min–max as error bars)."""
    timed = frame[(frame["status"] == "ok") & frame["time_ms"].notna()]
    if timed.empty:
        return None
    backends = ordered(timed["backend"])
    groups = _groups(timed)
    fig, axes = _panels(len(groups), "Time of one forward + backward (median)")
    for ax, (title, group) in zip(axes, groups):
        for backend in backends:
            own = group[group["backend"] == backend].sort_values("tokens")
            if own.empty:
                continue
            style = backend_style(backend, backends)
            low = (own["time_ms"] - own["time_ms_min"]).clip(lower=0).fillna(0)
            high = (own["time_ms_max"] - own["time_ms"]).clip(lower=0).fillna(0)
            ax.errorbar(own["tokens"], own["time_ms"], yerr=[low, high], markersize=5, capsize=2, **style)
        _tokens_axis(ax, group["tokens"])
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_ms(y)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("time" + (" (CPU)" if group["device"].iloc[0] == "cpu" else ""))
        ax.set_title(title)
    _legend(fig, _backend_handles(backends))
    return _save(fig, path)


@_styled
def plot_parity(frame: pd.DataFrame, path: Path) -> Path | None:
    """Relative error vs the fp32 reference of every cell, per back-end and quantity, one
    panel per precision mode, with that mode's tolerance as a dashed line."""
    checked = frame[frame["status"] == "ok"]
    present = [(col, label, marker) for col, label, marker in QUANTITIES if checked[col].notna().any()]
    if checked.empty or not present:
        return None
    backends = ordered(checked["backend"])
    modes = list(dict.fromkeys(checked["mode"]))
    fig, axes = _panels(len(modes), "Parity: relative error vs the fp32 reference (every cell)")
    errors = checked[[col for col, _, _ in present]].to_numpy(float)
    positive = errors[errors > 0]
    floor = positive.min() / 4 if positive.size else 1e-8  # exact zeros are drawn here, on the log axis
    for ax, mode in zip(axes, modes):
        rows = checked[checked["mode"] == mode]
        width = 0.8 / len(present)
        for i, backend in enumerate(backends):
            own = rows[rows["backend"] == backend]
            style = backend_style(backend, backends)
            for k, (col, _, marker) in enumerate(present):
                values = own[col].dropna().clip(lower=floor)
                x = i - 0.4 + width * (k + 0.5) + np.linspace(-width / 4, width / 4, len(values)) if len(values) > 1 \
                    else np.full(len(values), i - 0.4 + width * (k + 0.5))
                ax.scatter(x, values, color=style["color"], marker=marker, s=22, zorder=3, edgecolors="none")
        tolerance = rows["tolerance"].iloc[0]
        ax.axhline(tolerance, color="#d62728", linestyle="--", linewidth=1.2)
        ax.annotate(f"tolerance {format_error(tolerance)}", (1.0, tolerance), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=8, color="#d62728")
        ax.set_yscale("log")
        ax.set_xticks(range(len(backends)), backends, rotation=20 if len(backends) > 4 else 0)
        ax.set_xlim(-0.6, len(backends) - 0.4)
        ax.set_ylabel("relative error")
        ax.set_title(mode)
        ax.grid(axis="x", visible=False)
    handles = [Line2D([], [], color="#555555", marker=marker, linestyle="none", label=label)
               for _, label, marker in present]
    if (errors == 0).any():
        handles.append(Line2D([], [], color="none", label=f"exact 0 drawn at {format_error(floor)}"))
    _legend(fig, handles)
    return _save(fig, path)
