"""The accepted range of every numeric option of every command, checked in one place.

Each command's library function passes its numeric keywords to :func:`check_ranges` first, before
it reads a model, makes a folder, starts a worker or allocates: a value outside its range — a size
past what a tensor can be, a NaN, an infinite time limit, a seed past 64 bits — is one
:class:`~fusedce_profile.errors.UsageError` naming the option and the range (exit code 2 on the
command line), never an overflow deep in torch. The command line passes the values it parsed
unchanged, so a command and its Python function refuse the same values with the same line.

Why the bounds are where they are:

- A size (tokens N, batch B, sequence T, vocabulary V, hidden H) is at most 2³¹ − 1
  (:data:`MAX_SIZE`): the product of two of them, such as the N × V logits' element count, then
  stays below 2⁶², inside a tensor's 64-bit size. What cannot fit in memory below that bound is
  refused by the memory checks (:mod:`fusedce_profile.checks`), with the bytes it needs.
- A seed is stored as a 64-bit integer: 0 to 2⁶³ − 1.
- A time limit is at most a week (:data:`MAX_SECONDS`): longer is no limit, and ``0`` says that
  where an option allows it.
- A number that is not finite (``nan``, ``inf``) is never accepted.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument.fields import MAX_DIMENSION, MAX_TIME_MS
from fusedce_profiler.judgements.explain.readings import LARGEST_CARD_GIB

MAX_SIZE = MAX_DIMENSION
"""The largest tensor dimension an option may ask for (see the module docstring); stored rows are held to it too."""

MAX_SEED = 2**63 - 1
"""The largest seed: seeds are stored as 64-bit integers."""

MAX_SECONDS = MAX_TIME_MS / 1000
"""The longest time limit, one week."""

MAX_MEMORY_LIMIT_GIB = 1024.0
"""The largest worker memory limit in GiB (``doctor --memory-limit``): 4096 is 4 GiB typed in MiB."""

MAX_STEPS = 1_000_000
"""The most steps (timed repeats, warm-up steps, training steps) one option may ask for."""


@dataclass(frozen=True)
class Range:
    """Values from ``low`` to ``high``; ``integer``: whole numbers only (``bool`` is not one);
    ``above_low``: ``low`` itself excluded; ``below_high``: ``high`` itself excluded. ``high`` may be
    ``math.inf``: any finite number from ``low`` up."""

    low: float
    high: float
    integer: bool = False
    above_low: bool = False
    below_high: bool = False

    def holds(self, value) -> bool:
        """Whether ``value`` is a number of the right kind inside the range (and finite)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite, however long
            return False
        above = value > self.low if self.above_low else value >= self.low
        below = value < self.high if self.below_high else value <= self.high
        return above and below

    def describe(self) -> str:
        """The range in words: ``an integer from 1 to 2147483647``, ``a number ≥ 0 and < 1``."""
        if self.integer:
            return f"an integer from {int(self.low)} to {int(self.high)}"
        low = f"{'>' if self.above_low else '≥'} {self.low:g}"
        if math.isinf(self.high):
            return f"a finite number {low}"
        return f"a number {low} and {'<' if self.below_high else '≤'} {self.high:g}"


def _size(least: int = 1) -> Range:
    return Range(least, MAX_SIZE, integer=True)


_POSITIVE = Range(0.0, math.inf, above_low=True)
_FRACTION = Range(0.0, 1.0, below_high=True)

RANGES: dict[str, Range] = {
    # shapes
    "--tokens": _size(), "--batch": _size(), "--seq": _size(), "--vocab": _size(), "--hidden": _size(),
    "--seq-candidates": _size(), "--calibration-batches": _size(), "--fit-max": _size(),
    # steps and counts
    "--repeats": Range(1, MAX_STEPS, integer=True), "--warmup": Range(0, MAX_STEPS, integer=True),
    "--steps": Range(10, MAX_STEPS, integer=True),  # parity's final loss averages the last tenth
    "--confirm": Range(0, 1000, integer=True),
    "--seed": Range(0, MAX_SEED, integer=True),
    # loss options
    "--ignore-frac": _FRACTION, "--label-smoothing": _FRACTION, "--z-loss": Range(0.0, math.inf),
    "--softcap": _POSITIVE, "--lr": _POSITIVE,
    "--loss-tol": Range(0.0, 1.0, above_low=True, below_high=True),  # relative: 1 would pass any two finite losses
    # time and memory
    "--cell-timeout": Range(0.0, MAX_SECONDS), "--factory-timeout": Range(0.0, MAX_SECONDS, above_low=True),
    "--timeout": Range(0.0, MAX_SECONDS, above_low=True),
    # GiB: a larger figure is MiB typed for GiB (no GPU holds more than LARGEST_CARD_GIB; a worker
    # limit above MAX_MEMORY_LIMIT_GIB is no limit on any machine this runs on)
    "--memory-limit": Range(0.0, MAX_MEMORY_LIMIT_GIB, above_low=True), "--fit": Range(0.0, LARGEST_CARD_GIB, above_low=True),
    # explain's readings: MiB, GiB
    "--naive": _POSITIVE, "--fused": _POSITIVE, "--card": _POSITIVE, "--context-mib": _POSITIVE,
}
"""Every numeric option and its range (for every command that has it, unless :data:`COMMAND_RANGES`
narrows it)."""

COMMAND_RANGES: dict[str, dict[str, Range]] = {
    # a next-token batch needs two tokens a row
    "parity": {"--seq": _size(2)},
    # doctor's test batch pads one row of two and cuts one short: two rows, eight tokens at least
    "doctor": {"--batch": _size(2), "--seq": _size(8)},
}
"""Where a command accepts less of an option than :data:`RANGES` (keyed by the command's name)."""


def option_range(option: str, command: str = "") -> Range:
    """The range of ``option`` (``--tokens``) for ``command`` (``grid``, ``doctor``, ...)."""
    return COMMAND_RANGES.get(command, {}).get(option) or RANGES[option]


def _shown(value) -> str:
    text = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value}"
    return text if len(text) <= 40 else text[:37] + "..."


def check_ranges(command: str, **values) -> None:
    """:class:`~fusedce_profile.errors.UsageError` for the first value outside its option's range.

    ``values``: keyword = option name without its dashes, ``_`` for ``-`` (``ignore_frac`` is
    ``--ignore-frac``); a value may be a number or a list of them (an option that takes several);
    ``None`` (not given) and, in a list, ``None`` where the option takes ``none`` (``--softcap``)
    are skipped."""
    for name, value in values.items():
        option = "--" + name.replace("_", "-")
        accepted = option_range(option, command)
        items: Iterable = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if item is None:
                continue
            if not accepted.holds(item):
                raise UsageError(f"{option} {_shown(item)}: expected {accepted.describe()}")
