"""Bad command-line input: one error line on stderr and exit code 2 (:data:`fusedce_profile.exit_codes.BAD_INPUT`).

:func:`fail` builds the ``typer.Exit`` a command raises; :func:`usage_errors` turns the
``ValueError`` of a validating step (a config file, a job's settings, an output folder:
:class:`fusedce_profile.folders.OutputDirError` is one) into it, without a traceback.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from fusedce_cli import exit_codes
from fusedce_profile.console import error


def fail(message: str) -> typer.Exit:
    """Print ``message`` as an error and return the exit (code 2) for the caller to raise."""
    error(message)
    return typer.Exit(exit_codes.BAD_INPUT)


@contextmanager
def usage_errors() -> Iterator[None]:
    """A ``ValueError`` raised inside, or a run-folder file the tool refuses
    (:class:`~fusedce_profiler.instrument.confined.FolderRefused`), becomes :func:`fail` of its message;
    a user's callable whose own code ended a check
    (:class:`~fusedce_profiler.instrument.callables.CallableFailed`) its one line and exit 1."""
    from fusedce_profiler.instrument.callables import CallableFailed
    from fusedce_profiler.instrument.confined import FolderRefused

    try:
        yield
    except (ValueError, FolderRefused) as exc:
        raise fail(str(exc)) from None
    except CallableFailed as failed:
        error(str(failed))
        raise typer.Exit(exit_codes.CHECK_FAILED) from None
