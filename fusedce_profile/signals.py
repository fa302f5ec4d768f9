"""SIGTERM behaves like Ctrl-C: the run stops, its finished results are kept and reported.

:func:`stop_on_sigterm` installs a handler that raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread, so every ``except KeyboardInterrupt`` path that
keeps results valid serves both signals; :func:`interrupt_exit_code` says which code to
exit with.
"""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from fusedce_profile import exit_codes


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated`; the old handler is restored after."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_name(exc: KeyboardInterrupt) -> str:
    """``"SIGTERM"`` or ``"Ctrl-C"``: what stopped the command, as the reports and the terminal say it."""
    return "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """143 for SIGTERM, 130 for Ctrl-C."""
    return exit_codes.TERMINATED if isinstance(exc, Terminated) else exit_codes.INTERRUPTED
