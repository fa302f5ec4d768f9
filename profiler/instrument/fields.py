"""The scalar fields of a stored record, checked as they are read back: integers, floats (with the
non-finite spellings the store writes), times, devices; and the bounds a stored size or time may reach.

Public API: :func:`float_field`, :func:`int_field`, :func:`time_field`, :func:`device_field`,
:data:`MAX_DIMENSION`, :data:`MAX_TIME_MS`.
"""
from __future__ import annotations

import math
import re
from typing import Any

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The spellings :func:`fusedce_profiler.instrument.store.strict_json` writes for non-finite floats."""


def float_field(value: Any, name: str, *, optional: bool = True) -> float | None:
    """A stored float: a number, one of the non-finite spellings, or ``None`` when optional."""
    if value is None and optional:
        return None
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an integer past a float's range
        raise ValueError(f"{name} must be a number a float holds, got an integer of {len(str(abs(value)))} digits") \
            from None


MAX_DIMENSION = 2**31 - 1
"""The largest tensor dimension (tokens, batch, sequence, vocabulary, hidden) a run asks for or stores:
the product of two stays inside a tensor's 64-bit size (:mod:`fusedce_profile.ranges` says why)."""

MAX_TIME_MS = 7 * 24 * 3600 * 1000.0
"""The longest time a stored measurement may hold (one week: the longest time limit a run accepts)."""


def int_field(value: Any, name: str, *, optional: bool = True, minimum: int | None = None,
              maximum: int | None = None) -> int | None:
    """A stored integer (``None`` when optional); ``ValueError`` naming the field otherwise."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not -2 ** 63 <= value < 2 ** 63:  # what a tensor's size, a byte count or a seed can be
        raise ValueError(f"{name} must fit in 64 bits, got an integer of {len(str(abs(value)))} digits")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {value!r}")
    return value


def time_field(value: Any, name: str, *, optional: bool = True) -> float | None:
    """A stored time in milliseconds: a finite number from 0 to :data:`MAX_TIME_MS` (``None`` when
    optional); ``ValueError`` naming the field otherwise (a writer never stores NaN or ∞ as a time)."""
    number = float_field(value, name, optional=optional)
    if number is not None and not 0 <= number <= MAX_TIME_MS:
        raise ValueError(f"{name} must be a time from 0 to {MAX_TIME_MS:.0f} ms, got {number!r}")
    return number


_DEVICE = re.compile(r"(cpu|cuda(:[0-9]{1,4})?)")
"""The devices a measurement runs on and stores: ``cpu``, ``cuda`` or ``cuda:K`` (what
:meth:`fusedce_profiler.grid.spec.GridSpec.validate` lets a run ask for)."""


def device_field(value: Any, name: str) -> str:
    """A stored device name (:data:`_DEVICE`); ``ValueError`` naming the field otherwise (the value
    shown cut short and spelled out: it may be long or hold control characters)."""
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        shown = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
        raise ValueError(f"{name} must be cpu, cuda or cuda:K, got {shown!r}")
    return value
