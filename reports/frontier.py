"""The time–memory frontier of each head: which back-ends no other beats on both counts.

For one group of comparable cells (same device, mode, head, options) at one token count,
each back-end that ran is a point (peak extra bytes, median time). A back-end *dominates*
another when it holds no more memory, is not measurably slower (:func:`fusedce_reports.timing.faster`)
and is strictly better on one of the two. The frontier (the Pareto set) is the back-ends
that passed parity and that no other back-end that passed parity dominates; a back-end that
failed parity is shown but neither belongs to the frontier nor pushes another off it.

Pure functions of the results frame; :mod:`fusedce_reports.plots.frontier` draws them and
:mod:`fusedce_reports.findings` names them. A ``time_floor_ms`` column, when the frame has one, is
carried as the group's time floor.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fusedce_reports.palette import ordered
from fusedce_reports.tables import group_title
from fusedce_reports.timing import Timing, faster
from fusedce_reports.units import is_missing

GROUP_KEYS = ["device", "mode", "hidden", "vocab", "options"]

FEW_PANELS = 4
"""With at most this many (head, token count) pairs, :func:`frontiers` gives every pair."""


@dataclass(frozen=True)
class FrontierPoint:
    """One back-end at one size: ``dominated_by`` names the back-ends (that passed parity)
    dominating it, in report order."""

    backend: str
    peak_bytes: float
    timing: Timing
    parity_failed: bool
    on_frontier: bool
    dominated_by: tuple[str, ...]


@dataclass(frozen=True)
class Frontier:
    """The points of one group at one token count. ``title`` is the group's title
    (:func:`fusedce_reports.tables.group_title`), ``head`` its ``H×V`` label; ``out_of_memory`` the
    back-ends that ran out of memory at this size; ``noisy``: CPU times, compared by range."""

    title: str
    head: str
    tokens: int
    floor_bytes: float | None
    time_floor_ms: float | None
    points: tuple[FrontierPoint, ...]
    out_of_memory: tuple[str, ...]
    noisy: bool

    @property
    def pareto(self) -> list[FrontierPoint]:
        """The frontier's points, from the lowest memory to the highest."""
        return sorted((p for p in self.points if p.on_frontier), key=lambda p: (p.peak_bytes, p.timing.median_ms))


def dominates(a: tuple[float, Timing], b: tuple[float, Timing]) -> bool:
    """``a`` = (peak bytes, timing) holds no more memory than ``b``, is not measurably slower,
    and is better on one of the two counts."""
    (peak_a, time_a), (peak_b, time_b) = a, b
    if peak_a > peak_b or faster(time_b, time_a):
        return False
    return peak_a < peak_b or faster(time_a, time_b)


def _optional(rows: pd.DataFrame, column: str) -> float | None:
    if column not in rows:
        return None
    values = rows[column].dropna()
    return None if values.empty else float(values.iloc[0])


def frontier_at(rows: pd.DataFrame) -> Frontier | None:
    """The frontier of one group's cells at one token count (``None`` when none ran)."""
    drawable = rows[(rows["status"] == "ok") & rows["peak_bytes"].notna() & rows["time_ms"].notna()]
    if drawable.empty:
        return None
    cells = {row["backend"]: row for _, row in drawable.iterrows()}
    measured = {name: (float(row["peak_bytes"]), Timing.of(row)) for name, row in cells.items()}
    failed = set(drawable.loc[drawable["parity_ok"] == False, "backend"])  # noqa: E712 (object column)
    points = []
    for name in ordered(cells):
        winners = tuple(other for other in ordered(cells)
                        if other != name and other not in failed and dominates(measured[other], measured[name]))
        points.append(FrontierPoint(name, measured[name][0], measured[name][1], name in failed,
                                    name not in failed and not winners, winners))
    first = rows.iloc[0]
    floor = first["floor_bytes"]
    return Frontier(
        title=group_title(first["device"], first["mode"], int(first["hidden"]), int(first["vocab"]), first["options"]),
        head=first["head"], tokens=int(first["tokens"]), floor_bytes=None if is_missing(floor) else float(floor),
        time_floor_ms=_optional(rows, "time_floor_ms"), points=tuple(points),
        out_of_memory=tuple(ordered(rows.loc[rows["status"] == "oom", "backend"])),
        noisy=any(p.timing.noisy for p in points))


def largest_frontier(group: pd.DataFrame) -> Frontier | None:
    """A group's frontier at the largest token count where at least two back-ends ran (or,
    when no size has two, at the largest where one did)."""
    found = [f for _, rows in sorted(group.groupby("tokens"), key=lambda item: item[0])
             if (f := frontier_at(rows)) is not None]
    if not found:
        return None
    compared = [f for f in found if len(f.points) >= 2]
    return (compared or found)[-1]


def frontiers(frame: pd.DataFrame, every_size: bool = False) -> list[Frontier]:
    """The frontiers a report shows: every (group, token count) when there are at most
    :data:`FEW_PANELS` of them or ``every_size`` asks for them all, else each group's :func:`largest_frontier`."""
    if frame.empty:
        return []
    grouped = [group for _, group in frame.groupby(GROUP_KEYS, sort=False)]
    every = [f for group in grouped for _, rows in sorted(group.groupby("tokens"), key=lambda item: item[0])
             if (f := frontier_at(rows)) is not None]
    if every_size or len(every) <= FEW_PANELS:
        return every
    return [f for group in grouped if (f := largest_frontier(group)) is not None]
