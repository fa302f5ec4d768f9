"""Rows read back from a run folder are checked against the dataclass they become.

A stored row may come from another version of the tool or from someone else, so each scalar
field is checked against its annotation before the record is built: an ``int`` field holds an
integer (not a boolean), a ``float`` field a number or one of the non-finite spellings of
:func:`fusedce_profiler.instrument.store.float_field`, a ``str`` field a string, a ``bool``
field ``true``/``false``, an optional field may be ``null``; a ``list`` a list and a ``dict``
an object. Unknown keys are dropped; nested records are built by their own ``from_dict``.

Public API: :func:`checked_fields`.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from fusedce_profiler.instrument.store import float_field


def _allows_none(hint: Any) -> bool:
    return hint is Any or type(None) in typing.get_args(hint)


def _base(hint: Any) -> Any:
    """``int`` for ``int | None``, ``list`` for ``list[Part]``; the hint itself otherwise."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _base(args[0]) if len(args) == 1 else Any
    return typing.get_origin(hint) or hint


def _checked(value: Any, hint: Any, name: str) -> Any:
    if value is None and _allows_none(hint):
        return None
    base = _base(hint)
    if base is float:
        return float_field(value, name, optional=False)
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if base in (str, bool, list, dict) and not isinstance(value, base):
        kind = {str: "a string", bool: "true or false", list: "a list", dict: "an object"}[base]
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value


def checked_fields(cls: type, raw: Any, prefix: str = "", nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """The known fields of ``raw`` for the dataclass ``cls``, each checked against its annotation
    (``ValueError`` naming ``prefix.field``); the fields named in ``nested`` are passed through
    unchecked for the caller to build. A required field that is missing is a ``ValueError`` too."""
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix or cls.__name__} must be an object, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        name = f"{prefix}.{field.name}" if prefix else field.name
        if field.name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ValueError(f"{name} is missing")
            continue
        value = raw[field.name]
        values[field.name] = value if field.name in nested else _checked(value, hints[field.name], name)
    return values
