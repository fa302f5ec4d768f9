"""The console script's entry point: the command line's modules are imported only once a signal
during their import (seconds: torch, matplotlib) ends the process in one line.

Ctrl-C (SIGINT) while importing would otherwise print a traceback of the import machinery, and
SIGTERM end the process without a word. Both mean nothing was run yet: one line, exit 130 / 143.
Once imported, each command handles signals itself (its finished work kept, "continue with …").
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


def main() -> None:
    """Install the start-up handlers, import the command line, restore them, run it."""
    watched = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: signal.signal(sig, _stop_while_starting) for sig in watched}
    from fusedce_cli.app import main as run_command_line

    for sig, handler in previous.items():
        signal.signal(sig, handler)
    run_command_line()
