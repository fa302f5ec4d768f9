"""Offline PNG of a memory timeline (:class:`fusedce_profiler.instrument.snapshot.Timeline`).

Allocated MiB over time as a step line, the forward/backward boundary as a vertical
line, the peak marked, and the largest tensors alive at the peak listed beside it with
their sizes and where they were allocated (the smaller ones counted on one line). Needs only
matplotlib (no browser, no CDN). A timeline is bounded when it is read
(:meth:`~fusedce_profiler.instrument.snapshot.Timeline.from_dict`), so drawing one costs the
same whatever its file holds; what thinning left out is said on the plot (:func:`thinning_note`).

Public API: :func:`draw_timeline` (the ``Figure``; artists' ``gid``: ``allocated``,
``backward``, ``peak``, ``live-at-peak``), :func:`plot_timeline` (the PNG), :func:`thinning_note`,
:func:`timeline_file`, :func:`read_timeline`, :func:`timeline_plot_name`, :data:`TIMELINE_PREFIX`.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from matplotlib.figure import Figure

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.snapshot import Timeline
from fusedce_profiler.instrument.text import capped
from fusedce_reports.escape import plot_text
from fusedce_reports.figures import new_figure, save_figure
from fusedce_reports.units import MIB, format_bytes


FRAME_CHARS = 100
"""The most characters of a block's frame the side panel shows."""


def thinning_note(timeline: Timeline) -> str:
    """``"drawn from 15,000,000 points as 20,000 (…)"`` when the series was thinned, else ``""``."""
    if not timeline.thinned_from:
        return ""
    return (f"drawn from {timeline.thinned_from:,} points as {len(timeline.times_ms):,} (of each stretch its "
            "lowest and highest point; the peak and its neighbours exactly)")


def draw_timeline(timeline: Timeline, *, title: str = "") -> Figure:
    """The timeline's figure: allocated MiB vs ms on the left, the live tensors at the right."""
    fig, (ax, side) = new_figure((13, 4.8), 1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    mib = [b / MIB for b in timeline.allocated_bytes]
    ax.step(timeline.times_ms, mib, where="post", color="tab:blue", linewidth=1.2, gid="allocated")
    ax.fill_between(timeline.times_ms, mib, step="post", alpha=0.2, color="tab:blue")
    if timeline.backward_ms is not None:
        ax.axvline(timeline.backward_ms, color="tab:gray", linestyle="--", linewidth=1, gid="backward")
        ax.text(timeline.backward_ms, ax.get_ylim()[1] * 0.98, " backward →", va="top", fontsize=8,
                color="tab:gray")
        ax.text(timeline.backward_ms, ax.get_ylim()[1] * 0.98, "← forward ", va="top", ha="right",
                fontsize=8, color="tab:gray")
    ax.plot([timeline.peak_ms], [timeline.peak_bytes / MIB], "o", color="tab:red", gid="peak")
    ax.annotate(f"peak {format_bytes(timeline.peak_bytes)}", (timeline.peak_ms, timeline.peak_bytes / MIB),
                textcoords="offset points", xytext=(8, -12), color="tab:red", fontsize=9)
    ax.set_xlabel("time since start of step (ms)")
    ax.set_ylabel("allocated over baseline (MiB)")
    heading = title or "memory timeline"
    if timeline.thinned_from:
        heading += f"\n{thinning_note(timeline)}"
    ax.set_title(plot_text(heading), fontsize=10 if not timeline.thinned_from else 8)
    ax.grid(alpha=0.3)

    side.axis("off")
    lines = ["largest tensors alive at the peak:"]
    for block in timeline.live_at_peak:
        op = f" [{block.op}]" if block.op else ""
        lines.append(f"{format_bytes(block.size):>11}  {capped(block.frame + op, FRAME_CHARS)}")
    if timeline.unlisted_blocks:
        lines.append(f"{format_bytes(timeline.unlisted_bytes):>11}  in {timeline.unlisted_blocks:,} smaller "
                     f"block{'s' if timeline.unlisted_blocks > 1 else ''}")
    side.text(0.0, 1.0, plot_text("\n".join(lines)), va="top", ha="left", family="monospace", fontsize=7.5,
              transform=side.transAxes, gid="live-at-peak")
    fig.tight_layout()
    return fig


def plot_timeline(timeline: Timeline, path: str | Path, *, title: str = "") -> Path:
    """Draw ``timeline`` into ``path`` (PNG); returns the path."""
    return save_figure(draw_timeline(timeline, title=title), path, dpi=110)


TIMELINE_PREFIX = "timeline_"
"""How the name of a timeline's plot begins (a report removes the ones it did not draw again)."""

_MAX_STEM_BYTES = 160
"""Longest stem a timeline plot's name keeps: with its prefix, ``.png`` and a temporary file's
suffix the name stays under the 255 bytes a file name may take; a longer stem is cut and ended by
a hash of the whole (a legal timeline name of 229 characters made the whole report fail)."""


def timeline_plot_name(stem: str) -> str:
    """The file name of the plot of the timeline ``<stem>.timeline.json``."""
    raw = stem.encode("utf-8", "surrogateescape")
    if len(raw) > _MAX_STEM_BYTES:
        digest = hashlib.sha1(raw).hexdigest()[:12]
        stem = raw[:_MAX_STEM_BYTES - len(digest) - 1].decode("utf-8", "ignore") + "-" + digest
    return f"{TIMELINE_PREFIX}{stem}.png"


def timeline_file(folder: Path, recorded: str | None) -> Path | None:
    """The timeline JSON a stored record names, found inside ``folder`` only: at the stored
    relative path, or under ``snapshots/`` by its name (a moved folder keeps working); ``None``
    when it is not there or the stored path leads out of the folder. The path is not resolved:
    :func:`read_timeline` refuses a link on the way."""
    if not recorded:
        return None
    folder = Path(folder)
    for candidate in (folder / recorded, folder / store.SNAPSHOTS_DIR / Path(recorded).name):
        candidate = Path(os.path.normpath(candidate))
        if candidate.is_relative_to(folder) and candidate != folder and os.path.lexists(candidate):
            return candidate
    return None


def read_timeline(path: Path, folder: Path | None = None) -> Timeline:
    """The :class:`~fusedce_profiler.instrument.snapshot.Timeline` stored at ``path`` (plain JSON, never
    a pickle), read from inside ``folder`` (default: its own) without following links;
    ``ValueError`` when it is not one."""
    return Timeline.from_dict(store.read_json(path, inside=folder))
