"""``package.module:callable`` targets — a user back-end (``--backend``), a loss wrapper
(``doctor --loss``), a model factory (``--model``): the one parser and the one loader.

:func:`load_callable` imports the module and walks the dotted attribute path; every failure
is a ``ValueError`` whose message names the option, the target and what to do (where Python
looked for a module that is not found, the callables a module has when the name is wrong).
:func:`callable_problem` is the same check as a message or ``None``, for the checks a
command makes before it measures anything. :class:`CallableFailed`: the user's code itself
ended such a check (the callers run it in a worker).
"""
from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any


class CallableFailed(RuntimeError):
    """A user's callable (a back-end, a model factory) could not be checked or used because its
    own code ended the attempt: it called ``sys.exit``, ended its process, hung or ran out of its
    memory guard. The message is one line naming the option and the callable (exit 1)."""


def message_of(exc: BaseException) -> str:
    """``str(exc)``, never raising: a user's exception may define a ``__str__`` that raises, and
    the line that reports it must still be written (then it says the message could not be formed)."""
    try:
        return str(exc)
    except Exception as error:  # noqa: BLE001 - whatever the user's __str__ raises
        return f"<its message could not be formed: its __str__ raised {type(error).__name__}>"


def what_it_raised(exc: BaseException) -> str:
    """One line for what a user's callable ended with: ``called sys.exit(3)``, or the exception's
    type and the first line of its message (at most 300 characters)."""
    if isinstance(exc, SystemExit):
        try:
            return f"called sys.exit({exc.code!r})"
        except Exception:  # noqa: BLE001 - a code object whose repr raises
            return "called sys.exit"
    text = message_of(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def user_backend(name: str) -> str | None:
    """``name`` when it names a user's back-end (``"module:callable"``: code that is not the tool's,
    run in a worker of its own, :meth:`~fusedce_profiler.instrument.worker.Worker.serves`), else ``None``
    (a built-in back-end's name)."""
    return name if ":" in name else None


def split_target(target: str, option: str) -> tuple[str, str]:
    """``"package.module:attr.path"`` → ``("package.module", "attr.path")``; ``ValueError``
    when it is not written so."""
    module, sep, attr = target.partition(":")
    dotted = all(part.isidentifier() for part in f"{module}.{attr}".split("."))
    if not sep or not module or not attr or not dotted:
        raise ValueError(f"{option} {target}: expected 'package.module:callable'")
    return module, attr


def _import(module: str, option: str, target: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise ValueError(f"{option} {target}: no module named {module!r} on Python's path; put the folder that "
                             f"holds it on PYTHONPATH (the current folder, {os.getcwd()}, is searched too)") from None
        raise ValueError(f"{option} {target}: importing {module!r} failed: {what_it_raised(exc)}") from None
    except Exception as exc:  # the module's own code raised
        raise ValueError(f"{option} {target}: importing {module!r} failed: {what_it_raised(exc)}") from None


def load_callable(target: str, option: str) -> Any:
    """The callable ``target`` names (the current folder searched first, as ``python -m``
    does); ``ValueError`` naming ``option`` and what is wrong."""
    module_name, attr = split_target(target, option)
    add_working_dir_to_path()
    obj = _import(module_name, option, target)
    where = f"{module_name!r} ({getattr(obj, '__file__', None) or 'no file'})"
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f"; did you mean {', '.join(repr(n) for n in close)}?" if close else \
                (f"; it has {', '.join(sorted(names)[:12])}" if names else "")
            raise ValueError(f"{option} {target}: {where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{option} {target}: {type(obj).__name__} is not callable")
    return obj


def callable_problem(target: str, option: str) -> str | None:
    """Why ``target`` cannot be loaded from here (``None`` when it can)."""
    try:
        load_callable(target, option)
    except ValueError as exc:
        return str(exc)
    return None


def add_working_dir_to_path() -> str:
    """Put the current folder first on ``sys.path``, as ``python -m`` does (idempotent).

    The absolute path, so that workers (which get the parent's ``sys.path``) see it too.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return cwd
