"""The kinds of non-numeric arguments the commands' Python functions take, checked on the way in.

The command line hands every function strings, lists of strings and paths; a Python caller can
hand it anything. A value of the wrong kind is one :class:`~fusedce_profile.errors.UsageError`
naming the option (as the command line spells it) and what it takes, before anything runs, never
a ``TypeError`` or ``AttributeError`` from deep inside. Numbers are checked by
:mod:`fusedce_profile.ranges`.

Public API: :func:`names`, :func:`listed`, :func:`text`, :func:`flag`, :func:`console`, :func:`path`,
:func:`model_options`.
"""
from __future__ import annotations

import os
from pathlib import Path

from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument.text import shown

_SEQUENCES = (list, tuple, set, frozenset, range)




def names(values: object, option: str) -> list[str] | None:
    """``values`` as a list of strings (a string is a list of one); ``None`` when not given."""
    if values is None:
        return None
    items = [values] if isinstance(values, str) else list(values) if isinstance(values, _SEQUENCES) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise UsageError(f"{option} {shown(values)}: expected a name or a list of names")
    return items


def listed(values: object, option: str) -> list | None:
    """An option that takes several values, as a list (one value is a list of one); ``None`` when
    not given; an empty list is refused."""
    if values is None:
        return None
    values = list(values) if isinstance(values, _SEQUENCES) else [values]
    if not values:
        raise UsageError(f"{option}: give at least one value")
    return values


def text(value: object, option: str) -> str | None:
    """``value`` when it is a string (or ``None``: not given)."""
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{option} {shown(value)}: expected a string")
    return value


def flag(value: object, option: str, *, optional: bool = False) -> bool | None:
    """``value`` when it is ``True`` or ``False`` (or ``None`` where ``optional``: not given). A string
    is refused, not read by its truth: ``force="no"`` from a settings file would replace a run."""
    if not (isinstance(value, bool) or (optional and value is None)):
        raise UsageError(f"{option} {shown(value)}: expected True or False" + (" (or None)" if optional else ""))
    return value


def folder_flags(force: object, resume: object) -> tuple[bool, bool]:
    """``(force, resume)``, each checked by :func:`flag`."""
    return flag(force, "--force"), flag(resume, "--resume")


def console(value: object) -> object:
    """``value`` when it is a :class:`rich.console.Console` (made: ``Console()``, not the class), or ``None``
    (the default): the commands print through rich's options and hand it to rich's progress display."""
    from rich.console import Console

    if value is not None and not isinstance(value, Console):
        raise UsageError(f"console {shown(value)}: expected a rich.console.Console (made with Console()), or None")
    if value is not None and getattr(value.file, "closed", False):
        raise UsageError("console: its file is closed (nothing could be printed)")
    return value


def path(value: object, option: str) -> Path | None:
    """``value`` as a :class:`~pathlib.Path` when it is a string or a path (``None``: not given)."""
    if value is None:
        return None
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{option} {shown(value)}: expected a path")
    return Path(value)


def model_options(preset: object = None, config: object = None, hf: object = None, model: object = None,
                  head: object = None) -> None:
    """The options naming a model, each of its kind: names for ``--preset``, ``--hf``, ``--model``
    and ``--head``, a path for ``--config``."""
    for value, option in ((preset, "--preset"), (hf, "--hf"), (model, "--model"), (head, "--head")):
        text(value, option)
    path(config, "--config")
