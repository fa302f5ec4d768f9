"""Who wins, size by size: the lowest-memory and the fastest back-end of each group, and
the time–memory frontier at the largest size.

Three sentences per group of comparable cells (same device, mode, head, options), built
from the frame alone, about every back-end that ran — not only the fused one against torch
(:mod:`fusedce_reports.findings` makes them findings):

- :func:`lowest_memory_sentence`: the back-end with the lowest peak at each token count
  where two or more ran, and every back-end's peak at the largest such size;
- :func:`fastest_sentence`: the fastest at each token count, among back-ends that passed
  parity; a faster one that failed parity is named as such, never as the fastest; on the
  CPU a back-end is the fastest only when its time range lies below every other's
  (:mod:`fusedce_reports.timing`), otherwise the times are within noise;
- :func:`frontier_sentence`: the back-ends on the time–memory frontier
  (:mod:`fusedce_reports.frontier`) at the largest size, and who dominates the others.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from fusedce_reports.frontier import Frontier, largest_frontier
from fusedce_reports.palette import ordered
from fusedce_reports.timing import Timing, faster
from fusedce_reports.units import format_bytes, format_ms, format_tokens


def names(backends: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(backends)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _sizes(tokens: Sequence[int]) -> str:
    return names([format_tokens(int(t)) for t in tokens])


def _segments(outcomes: list[tuple[int, tuple]]) -> list[tuple[list[int], tuple]]:
    """Consecutive sizes with the same outcome, merged: [([1k, 2k], outcome), ([4k], other)]."""
    merged: list[tuple[list[int], tuple]] = []
    for tokens, outcome in outcomes:
        if merged and merged[-1][1] == outcome:
            merged[-1][0].append(tokens)
        else:
            merged.append(([tokens], outcome))
    return merged


def _sentence(outcomes: list[tuple[int, tuple]], phrase: Callable[[list[int], tuple, bool], str],
              every: Callable[[tuple[str, ...], str], str]) -> str:
    """One sentence over the sizes: ``every(winners, where)`` when the same back-ends won at
    every size, else ``phrase(sizes, outcome, first)`` per run of sizes with one outcome."""
    segments = _segments(outcomes)
    if len(segments) == 1 and segments[0][1][0] == "won":
        sizes = segments[0][0]
        where = f"every size measured ({_sizes(sizes)} tokens)" if len(sizes) > 1 else f"{_sizes(sizes)} tokens"
        return every(segments[0][1][1], where)
    return "; ".join(phrase(sizes, outcome, i == 0) for i, (sizes, outcome) in enumerate(segments))


def _is(backends: Sequence[str]) -> str:
    return "is" if len(backends) == 1 else "are jointly"


# --- memory -----------------------------------------------------------------------------------

def lowest_memory_sentence(group: pd.DataFrame) -> str | None:
    """The lowest peak at each size where two or more back-ends ran, whoever holds it."""
    ran = group[(group["status"] == "ok") & group["peak_bytes"].notna()]
    outcomes, detail = [], {}
    for tokens, rows in sorted(ran.groupby("tokens"), key=lambda item: item[0]):
        if rows["backend"].nunique() < 2:
            continue
        rows = rows.sort_values("peak_bytes", kind="stable")
        low = rows["peak_bytes"].iloc[0]
        winners = tuple(ordered(rows.loc[rows["peak_bytes"] == low, "backend"]))
        others = rows[rows["peak_bytes"] > low]
        outcomes.append((int(tokens), ("won", winners)))
        detail[int(tokens)] = (low, None if others.empty else others.iloc[0])
    if not outcomes:
        return None

    def phrase(sizes: list[int], outcome: tuple, first: bool) -> str:
        low, runner = detail[sizes[-1]]
        against = f", next {runner['backend']} {format_bytes(runner['peak_bytes'])}" if runner is not None else ""
        lead = "The lowest peak is " if first else ""
        return (f"{lead}{names(outcome[1])}'s at {_sizes(sizes)} tokens "
                f"({format_bytes(low)} at {format_tokens(sizes[-1])}{against})")

    text = _sentence(outcomes, phrase, lambda winners, where: (
        f"{names(winners)} {'holds' if len(winners) == 1 else 'jointly hold'} the lowest peak at {where}"))
    largest = outcomes[-1][0]
    at = ran[ran["tokens"] == largest].sort_values("peak_bytes", kind="stable")
    listing = ", ".join(f"{r.backend} {format_bytes(r.peak_bytes)}" for r in at.itertuples())
    return f"{text}. Peak extra at {format_tokens(largest)} tokens: {listing}."


# --- time -------------------------------------------------------------------------------------

def _speed_outcome(rows: pd.DataFrame) -> tuple:
    """("won", names) / ("noise", names) / ("alone", name) / ("none",) at one size."""
    passed = rows[rows["parity_ok"] != False]  # noqa: E712 (object column of bools)
    if passed.empty:
        return ("none",)
    if len(passed) == 1:
        return ("alone", (passed["backend"].iloc[0],))
    timings = {r["backend"]: Timing.of(r) for _, r in passed.iterrows()}
    best = min(timings, key=lambda b: timings[b].median_ms)
    if timings[best].noisy:
        close = [b for b in timings if b != best and not faster(timings[best], timings[b])]
        return ("won", (best,)) if not close else ("noise", tuple(ordered([best, *close])))
    low = timings[best].median_ms
    return ("won", tuple(ordered(b for b, t in timings.items() if t.median_ms == low)))


def _speed_phrase(sizes: list[int], outcome: tuple, first: bool) -> str:
    kind, at = outcome[0], f"{'At' if first else 'at'} {_sizes(sizes)} tokens"
    if kind == "won":  # the phrase begins with the names, so "at" is lower-case even when it leads
        return f"{names(outcome[1])} {_is(outcome[1])} the fastest at {_sizes(sizes)} tokens"
    if kind == "noise":
        return (f"{at} the times of {names(outcome[1])} are within noise (their min–max ranges overlap), "
                "so none is called the fastest")
    if kind == "alone":
        return f"{at} only {outcome[1][0]} passed parity, so no fastest is named"
    return f"{at} no back-end passed parity"


def _time_text(row: pd.Series, reference: float | None) -> str:
    timing = Timing.of(row)
    text = f"{row['backend']} {format_ms(timing.median_ms)}"
    if timing.noisy and timing.low_ms is not None and timing.high_ms is not None:
        text += f" ({format_ms(timing.low_ms)}–{format_ms(timing.high_ms)})"
    if row["parity_ok"] == False:  # noqa: E712 (None: no verdict)
        return text + " (failed parity)"
    if not timing.noisy and reference and row["time_ms"] != reference:
        text += f" ({row['time_ms'] / reference:.2f}×)"
    return text


def fastest_sentence(group: pd.DataFrame) -> str | None:
    """The fastest back-end at each size where two or more ran, among those that passed parity."""
    timed = group[(group["status"] == "ok") & group["time_ms"].notna()]
    outcomes, beaten_by_failed = [], []
    for tokens, rows in sorted(timed.groupby("tokens"), key=lambda item: item[0]):
        if rows["backend"].nunique() < 2:
            continue
        outcomes.append((int(tokens), _speed_outcome(rows)))
        passed = rows[rows["parity_ok"] != False]  # noqa: E712
        failed = rows[rows["parity_ok"] == False]  # noqa: E712
        best = passed["time_ms"].min() if not passed.empty else float("inf")
        for row in failed[failed["time_ms"] < best].itertuples():
            beaten_by_failed.append((row.backend, int(tokens), row.time_ms))
    if not outcomes:
        return None
    text = _sentence(outcomes, _speed_phrase,
                     lambda winners, where: f"{names(winners)} {_is(winners)} the fastest at {where}")
    largest = outcomes[-1][0]
    at = timed[timed["tokens"] == largest].sort_values("time_ms", kind="stable")
    passed = at[at["parity_ok"] != False]  # noqa: E712
    reference = None if passed.empty else float(passed["time_ms"].iloc[0])
    listing = ", ".join(_time_text(row, reference) for _, row in at.iterrows())
    text += f". Forward + backward at {format_tokens(largest)} tokens: {listing}."
    for backend in ordered(b for b, _, _ in beaten_by_failed):
        own = [(t, ms) for b, t, ms in beaten_by_failed if b == backend]
        text += (f" {backend} was quicker at {_sizes([t for t, _ in own])} tokens "
                 f"({format_ms(own[-1][1])} at {format_tokens(own[-1][0])}) but failed parity, so it is not "
                 "counted as the fastest.")
    return text


# --- frontier ---------------------------------------------------------------------------------

def _point_text(point) -> str:
    return f"{point.backend} ({format_bytes(point.peak_bytes)}, {format_ms(point.timing.median_ms)})"


def frontier_sentence(frontier: Frontier) -> str:
    """``On 768×32777 at 64k tokens the time–memory frontier is fusedce (…) and torch-compile
    (…); liger is dominated by fusedce.``"""
    pareto = frontier.pareto
    where = f"On {frontier.head} at {format_tokens(frontier.tokens)} tokens"
    if not pareto:
        text = f"{where} no back-end that passed parity ran, so there is no time–memory frontier"
    elif len(pareto) == 1 and len(frontier.points) > 1:
        text = f"{where} {_point_text(pareto[0])} alone is on the time–memory frontier"
    else:
        text = f"{where} the time–memory frontier is {names([_point_text(p) for p in pareto])}"
    dominated = [p for p in frontier.points if p.dominated_by]
    if dominated:
        on_it = {p.backend for p in pareto}
        # name the frontier's back-ends that dominate it (every dominated point has one on a GPU)
        text += "; " + ", ".join(
            f"{p.backend} is dominated by {names([b for b in p.dominated_by if b in on_it] or p.dominated_by)}"
            for p in dominated)
    failed = [p.backend for p in frontier.points if p.parity_failed]
    if failed:
        text += f"; {names(failed)} failed parity and {'is' if len(failed) == 1 else 'are'} left out"
    if frontier.out_of_memory:
        text += f"; {names(frontier.out_of_memory)} ran out of memory at this size"
    if frontier.noisy and len(frontier.points) > 1:
        text += " (CPU times: a back-end counts as faster only when its time range lies below the other's)"
    return text + "."


def largest_frontier_sentence(group: pd.DataFrame) -> str | None:
    """:func:`frontier_sentence` of the group's frontier at its largest size where two or more
    back-ends ran (``None`` when no size has two)."""
    frontier = largest_frontier(group)
    return None if frontier is None or len(frontier.points) < 2 else frontier_sentence(frontier)
