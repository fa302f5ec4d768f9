"""Offline PNG of a memory timeline (:class:`profiler.snapshot.Timeline`).

Allocated MiB over time as a step line, the forward/backward boundary as a vertical
line, the peak marked, and the largest tensors alive at the peak listed beside it with
their sizes and where they were allocated. Needs only matplotlib (no browser, no CDN).

Public API: :func:`plot_timeline`.
"""
from __future__ import annotations

from pathlib import Path

from profiler.snapshot import Timeline
from reports.figures import save_figure

_MiB = 2**20


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def plot_timeline(timeline: Timeline, path: str | Path, *, title: str = "") -> Path:
    """Draw ``timeline`` into ``path`` (PNG); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.8))
    FigureCanvasAgg(fig)  # render with Agg whatever pyplot's backend is
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    mib = [b / _MiB for b in timeline.allocated_bytes]
    ax.step(timeline.times_ms, mib, where="post", color="tab:blue", linewidth=1.2)
    ax.fill_between(timeline.times_ms, mib, step="post", alpha=0.2, color="tab:blue")
    if timeline.backward_ms is not None:
        ax.axvline(timeline.backward_ms, color="tab:gray", linestyle="--", linewidth=1)
        ax.text(timeline.backward_ms, ax.get_ylim()[1] * 0.98, " backward →", va="top", fontsize=8,
                color="tab:gray")
        ax.text(timeline.backward_ms, ax.get_ylim()[1] * 0.98, "← forward ", va="top", ha="right",
                fontsize=8, color="tab:gray")
    ax.plot([timeline.peak_ms], [timeline.peak_bytes / _MiB], "o", color="tab:red")
    ax.annotate(f"peak {_fmt_bytes(timeline.peak_bytes)}", (timeline.peak_ms, timeline.peak_bytes / _MiB),
                textcoords="offset points", xytext=(8, -12), color="tab:red", fontsize=9)
    ax.set_xlabel("time since start of step (ms)")
    ax.set_ylabel("allocated over baseline (MiB)")
    ax.set_title(title or "memory timeline", fontsize=10)
    ax.grid(alpha=0.3)

    side.axis("off")
    lines = ["largest tensors alive at the peak:"]
    for block in timeline.live_at_peak:
        op = f" [{block.op}]" if block.op else ""
        lines.append(f"{_fmt_bytes(block.size):>11}  {block.frame}{op}")
    side.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=7.5,
              transform=side.transAxes)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
