"""Human-readable numbers for tables and findings: bytes, times, relative errors."""
from __future__ import annotations

import math

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10


def is_missing(value: object) -> bool:
    """True for ``None`` and NaN (how pandas stores a missing number)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_bytes(n: float | None) -> str:
    """``2.55 GiB``, ``153 MiB``, ``12.0 KiB``; ``–`` when missing. Binary units (2^30)."""
    if is_missing(n):
        return "–"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{sign}{value:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


def format_ms(ms: float | None) -> str:
    """Milliseconds with three significant figures (seconds from 1000 ms); ``–`` when missing."""
    if is_missing(ms):
        return "–"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.2f} ms"


def format_error(err: float | None) -> str:
    """A relative error as ``3.1e-03``; ``–`` when missing; ``0`` when exact."""
    if is_missing(err):
        return "–"
    if err == 0:
        return "0"
    return f"{err:.1e}"


def format_percent(frac: float | None) -> str:
    """A fraction as a percentage with no decimals (``0.943`` → ``94%``)."""
    if is_missing(frac):
        return "–"
    text = f"{100 * frac:.0f}"
    return "0%" if text == "-0" else f"{text}%"  # a tiny negative is 0%, not "-0%"


def format_tokens(n: int) -> str:
    """Token counts as engineers say them: ``1k``, ``8k``, ``32k``, ``1536``."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)
