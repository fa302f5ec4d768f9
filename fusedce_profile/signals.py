"""SIGTERM and SIGHUP behave like Ctrl-C: the run stops, its finished results are kept and reported.

:func:`stop_on_sigterm` installs a handler that raises :class:`Terminated` (a
``KeyboardInterrupt``; :class:`HungUp` for SIGHUP, the terminal closed) in the main thread, so
every ``except KeyboardInterrupt`` path that keeps results valid serves every stop;
:func:`interrupt_exit_code` says which code to exit with.
"""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from fusedce_profile import exit_codes


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""

    signal_name = "SIGTERM"
    exit_code = exit_codes.TERMINATED


class HungUp(Terminated):
    """The process received SIGHUP (its terminal was closed): handled as SIGTERM, exit 129."""

    signal_name = "SIGHUP"
    exit_code = exit_codes.HUNG_UP


def raise_terminated(signum: int, frame) -> None:
    """The handler of SIGTERM and SIGHUP that makes them stop the main thread as Ctrl-C does."""
    raise HungUp() if signum == signal.SIGHUP else Terminated()


STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals :func:`stop_on_sigterm` turns into :class:`Terminated` (Ctrl-C is Python's own)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` / :class:`HungUp`; the old
    handlers are restored after."""
    try:
        previous = {signum: signal.signal(signum, raise_terminated) for signum in STOPPING_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def first_stop(exc: KeyboardInterrupt) -> KeyboardInterrupt:
    """The stop that ``exc`` interrupted the handling of, if any, and so on back: the first signal.
    A second signal raised while the first one's exception unwinds (a worker being shut down)
    replaces it in flight; Python keeps the first as its ``__context__``."""
    while isinstance(exc.__context__, KeyboardInterrupt):
        exc = exc.__context__
    return exc


def signal_name(exc: KeyboardInterrupt) -> str:
    """``"SIGTERM"``, ``"SIGHUP"`` or ``"Ctrl-C"``: what stopped the command (the first signal,
    :func:`first_stop`), as the reports and the terminal say it."""
    exc = first_stop(exc)
    return exc.signal_name if isinstance(exc, Terminated) else "Ctrl-C"


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C: the first signal's (:func:`first_stop`)."""
    exc = first_stop(exc)
    return exc.exit_code if isinstance(exc, Terminated) else exit_codes.INTERRUPTED
