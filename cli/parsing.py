"""Parse and validate the command line's grid values; errors become exit code 2.

Every function raises :class:`typer.BadParameter` naming the option and the bad value, so
the user sees ``Invalid value for '--tokens': ...`` and the exit code is 2.
"""
from __future__ import annotations

import re

import typer

from fusedce_profiler.instrument.precision import MODES, canonical_mode

_SUFFIX = {"k": 1024, "m": 1024 * 1024}


def parse_count(text: str, option: str) -> int:
    """A positive integer; ``8k`` means 8192 and ``1m`` 1048576 (binary, like token counts)."""
    shown = repr(text) if len(text) <= 40 else repr(text[:37] + "...")
    match = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", text)
    if not match:
        raise typer.BadParameter(f"{shown} is not a positive integer (e.g. 8192 or 8k)", param_hint=option)
    try:
        value = int(match.group(1)) * _SUFFIX.get(match.group(2).lower(), 1)
    except ValueError:  # past the digits Python converts (4300): no count is that long
        raise typer.BadParameter(f"{shown} has {len(match.group(1))} digits: not a count", param_hint=option) \
            from None
    if value <= 0:
        raise typer.BadParameter(f"{text!r} must be positive", param_hint=option)
    return value


def parse_counts(text: str | None, option: str) -> list[int] | None:
    """A comma-separated list of positive integers (``1024,4k,16k``), sorted, duplicates
    removed; ``None`` stays ``None`` (option not given)."""
    if text is None:
        return None
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise typer.BadParameter("give at least one value", param_hint=option)
    return sorted({parse_count(item, option) for item in items})


def parse_devices(text: str | None, option: str = "--devices") -> list[str] | None:
    """A comma-separated list of distinct ``CUDA_VISIBLE_DEVICES`` values (``0,1,2,3`` or
    GPU UUIDs); ``None`` stays ``None``."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(items) or any(" " in item for item in items):
        raise typer.BadParameter(f"expected comma-separated device ids such as 0,1,2,3; got {text!r}",
                                 param_hint=option)
    if len(set(items)) != len(items):
        raise typer.BadParameter(f"a device is named twice in {text!r}", param_hint=option)
    return items


def parse_modes(values: list[str] | None) -> list[str] | None:
    """Repeatable and/or comma-separated ``--mode`` values, each a known mode or its Lightning name."""
    if not values:
        return None
    return list(dict.fromkeys(parse_mode(m.strip()) for value in values for m in value.split(",") if m.strip()))


def parse_mode(name: str | None, allowed: tuple[str, ...] = MODES) -> str | None:
    """One ``--mode`` value: a mode in ``allowed`` or a Lightning precision name for one
    (``bf16-mixed`` is ``amp-bf16``); ``None`` stays ``None``."""
    if name is None:
        return None
    try:
        return canonical_mode(name, allowed, what="")
    except ValueError as error:
        raise typer.BadParameter(str(error).strip(), param_hint="--mode") from None


def parse_floats(text: str | None, option: str, *, allow_none: bool = False) -> tuple | None:
    """A comma-separated list of numbers (``0,0.3``); with ``allow_none``, ``none`` is an
    item too (``--softcap none,30``). ``None`` stays ``None`` (option not given)."""
    if text is None:
        return None
    values: list[float | None] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        if allow_none and item.lower() == "none":
            values.append(None)
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise typer.BadParameter(f"{item!r} is not a number", param_hint=option) from None
    if not values:
        raise typer.BadParameter("give at least one value", param_hint=option)
    return tuple(dict.fromkeys(values))
