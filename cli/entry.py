"""The console script's entry point: the command line's modules are imported only once a signal
during their import (seconds: torch, matplotlib) ends the process in one line.

Ctrl-C (SIGINT) while importing would otherwise print a traceback of the import machinery, and
SIGTERM end the process without a word. Both mean nothing was run yet: one line, exit 130 / 143.
The start-up handlers stay until the command line has been built and parsed and a command is
about to run (:func:`command_starting`); from there each command handles signals itself (its
finished work kept, "continue with …").
A SIGINT the shell set to be ignored (a background job) stays ignored.
"""
from __future__ import annotations

import os
import signal
import sys


def _stop_while_starting(signum: int, frame) -> None:
    try:
        name = signal.Signals(signum).name
        sys.stderr.write(f"fusedce-profile: stopped by {name} while starting; nothing was run\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


_previous: dict[int, object] = {}  # the handlers the start-up ones replaced, until a command starts


def command_starting() -> None:
    """Give the signals back to the handlers they had (a command's own take over from here). The
    command line calls it first thing once it has parsed the command and is about to run it (its
    top-level callback); a no-op where :func:`main` did not install the start-up handlers."""
    while _previous:
        sig, handler = _previous.popitem()
        signal.signal(sig, handler)


def main() -> None:
    """Install the start-up handlers, import the command line and run it; the handlers stay until
    the command starts (:func:`command_starting`), through building and parsing the command line."""
    watched = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(sig) is not signal.SIG_IGN]
    _previous.update({sig: signal.signal(sig, _stop_while_starting) for sig in watched})
    from fusedce_cli.app import main as run_command_line

    try:
        run_command_line()
    finally:
        command_starting()


if __name__ == "__main__":
    main()
