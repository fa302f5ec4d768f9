"""The console script's entry point: the command line's modules are imported only once a signal
during their import (seconds: torch, matplotlib) ends the process in one line.

Ctrl-C (SIGINT) while importing would otherwise print a traceback of the import machinery, and
SIGTERM end the process without a word. Both mean nothing was run yet: one line, exit 130 / 143.
The start-up handlers stay until the command line has been built and parsed and a command is
about to run (:func:`command_starting`); from there Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM /
SIGHUP raise :class:`~fusedce_profile.signals.Terminated` / ``HungUp`` anywhere in the command: a command
with finished work keeps it and says how to continue; one stopped before it had anything to keep (its
option checks, a user module being imported in a check worker) ends in the line of
:func:`fusedce_cli.ending.main`, its workers and temporary folders cleaned up on the way out.
A SIGINT the shell set to be ignored (a background job) stays ignored.
"""
from __future__ import annotations

import os
import signal
import sys


def _stop_while_starting(signum: int, frame) -> None:
    try:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name  # as a started command says it
        sys.stderr.write(f"fusedce-profile: stopped by {name} while starting; nothing was run\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


_previous: dict[int, object] = {}  # the handlers the start-up ones replaced, until a command starts


def command_starting() -> None:
    """Hand the signals to the command: Ctrl-C back to Python's handler (``KeyboardInterrupt``),
    SIGTERM and SIGHUP to one raising :class:`~fusedce_profile.signals.Terminated` / ``HungUp``. The
    command line calls it first thing once it has parsed the command and is about to run it (its
    top-level callback); a no-op where :func:`main` did not install the start-up handlers (the
    command line run inside another program keeps that program's handlers).

    NumPy is imported first, while a signal still ends the process in one line: torch's start-up (its C
    module) imports NumPy and drops whatever that import raised, so a Ctrl-C or SIGTERM landing in those
    0.1 s was swallowed and left NumPy half-imported, for a traceback in the report's plots later."""
    import numpy  # noqa: F401

    from fusedce_profile.signals import raise_terminated

    while _previous:
        sig, handler = _previous.popitem()
        signal.signal(sig, handler if sig == signal.SIGINT else raise_terminated)


def _standard_streams_open() -> None:
    """A standard stream the shell closed (``>&-``, ``2>&-``) is opened on the null device: the run
    goes on without its printing, and no file the run opens later takes the descriptor (where a
    child process's output, or a stray print, would land in it). The output streams spell out what
    their encoding cannot write (``PYTHONIOENCODING=ascii``) instead of failing on it."""
    for fd, name, flags in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))
    for stream in (sys.stdout, sys.stderr):  # a character the output's encoding lacks is spelled out
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):  # not a text file of Python's own
            pass


def main() -> None:
    """Install the start-up handlers, import the command line and run it; the handlers stay until
    the command starts (:func:`command_starting`), through building and parsing the command line."""
    _standard_streams_open()
    watched = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if signal.getsignal(sig) is not signal.SIG_IGN]
    _previous.update({sig: signal.signal(sig, _stop_while_starting) for sig in watched})
    try:
        from fusedce_cli.ending import main as run_command_line

        run_command_line()
    except MemoryError:  # a limit on the address space (ulimit -v): torch's import is the first to meet it
        _stopped("out of memory in the command itself (its address-space limit, `ulimit -v`, or the machine's)")
    except SystemError as exc:  # the interpreter's own failure: an allocation a C extension did not check
        _stopped(f"the Python interpreter failed in the command itself (SystemError: {exc}){_address_space_hint()}")
    except ImportError as exc:  # an installation that cannot load (a library's shared object not mapped)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        _stopped(f"could not import {exc.name or 'a library'}: {lines[-1] if lines else type(exc).__name__}")
    finally:
        command_starting()


def _address_space_hint() -> str:
    """``"; …"`` naming this process's address-space limit when one is set (it makes allocations
    fail, and an extension that does not check one fails this way); ``""`` when none is."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return "" if soft == resource.RLIM_INFINITY else \
        f"; its address-space limit (`ulimit -v`) is {soft >> 20} MiB: raise it"


def _stopped(why: str) -> None:
    """One line on stderr, exit 3: the command could not go on (what it finished is kept: every
    command releases its folder on the way out). The process ends at once (:func:`_leave`)."""
    sys.stderr.write(f"error: {why}\n")
    sys.stderr.flush()
    _leave(3)


def _leave(code: int) -> None:
    """End the process without the interpreter's teardown: what ran out (memory under ``ulimit -v``)
    fails its exit callbacks too, a traceback after the one line."""
    os._exit(code)

if __name__ == "__main__":
    main()
