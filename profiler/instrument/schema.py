"""Records read back from a run folder are checked against the dataclass they become.

A stored record may come from another version of the tool or from someone else, so every field
is checked against its annotation, all the way down, before the record is built: an ``int``
field holds an integer (not a boolean) that fits in 64 bits, a ``float`` field a number or one
of the non-finite spellings of :func:`fusedce_profiler.instrument.fields.float_field`, a ``str``
field a string, a ``bool`` field ``true``/``false``, an optional field may be ``null``; a
``list[T]`` is a list of ``T``, a ``tuple[A, B]`` a list of that length, a ``dict[str, T]`` an
object of ``T``; a nested dataclass is built the same way. A bare ``dict``/``list``/``Any`` is
held as stored. Unknown keys are dropped. A violation is a ``ValueError`` naming the field by its
path (``hypotheses[1].tolerance_naive.noise``) and what was expected.

Public API: :func:`build`, :func:`checked_fields`, :func:`checked_value`.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

from fusedce_profiler.instrument.fields import float_field, int_field

T = TypeVar("T")
_SHOWN = 60  # characters of a wrong value quoted in the message


def _allows_none(hint: Any) -> bool:
    return hint is Any or type(None) in typing.get_args(hint)


def _is_union(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _wrong(name: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{name} must be {expected}, got {_shown(value)}")


def checked_value(value: Any, hint: Any, name: str) -> Any:
    """``value`` checked against the annotation ``hint`` (see the module docstring); the value
    to hold: a nested dataclass built, a tuple made of a stored list, a float of a stored int."""
    if value is None and _allows_none(hint):
        return None
    if hint is Any:
        return value
    if _is_union(hint):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return checked_value(value, options[0], name)
        for option in options:
            try:
                return checked_value(value, option, name)
            except ValueError:
                continue
        raise _wrong(name, " or ".join(getattr(o, "__name__", str(o)) for o in options), value)
    base, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if dataclasses.is_dataclass(base):
        return build(base, value, name)
    if base is float:
        return float_field(value, name, optional=False)
    if base is int:
        return int_field(value, name, optional=False)
    if base is str and not isinstance(value, str):
        raise _wrong(name, "a string", value)
    if base is bool and not isinstance(value, bool):
        raise _wrong(name, "true or false", value)
    if base is list:
        if not isinstance(value, list):
            raise _wrong(name, "a list", value)
        return [checked_value(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)] if args else value
    if base is tuple:
        if not isinstance(value, (list, tuple)):
            raise _wrong(name, "a list", value)
        if args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _wrong(name, f"a list of {len(args)} values", value)
            return tuple(checked_value(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        return tuple(checked_value(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)) if args else tuple(value)
    if base is dict:
        if not isinstance(value, dict):
            raise _wrong(name, "an object", value)
        if not args:
            return value
        return {key: checked_value(v, args[1], f"{name}.{key}") for key, v in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def checked_fields(cls: type, raw: Any, prefix: str = "", nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """The known fields of ``raw`` for the dataclass ``cls``, each checked against its annotation
    (``ValueError`` naming ``prefix.field``); the fields named in ``nested`` are passed through
    unchecked for the caller to build. A required field that is missing is a ``ValueError`` too."""
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix or cls.__name__} must be an object, got {_shown(raw)}")
    hints = _hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        name = f"{prefix}.{field.name}" if prefix else field.name
        if field.name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ValueError(f"{name} is missing")
            continue
        value = raw[field.name]
        values[field.name] = value if field.name in nested else checked_value(value, hints[field.name], name)
    return values


def build(cls: type[T], raw: Any, prefix: str = "") -> T:
    """An instance of the dataclass ``cls`` from its stored form, every field checked (see the
    module docstring); a check the class makes itself (``__post_init__``) names ``prefix``."""
    values = checked_fields(cls, raw, prefix)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{prefix}: {exc}" if prefix else str(exc)) from None
