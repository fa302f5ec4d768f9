"""How the command line ends: its exit code, one line for what no command reported, and a fast exit.

:func:`main` runs the command built in :mod:`fusedce_cli.app`; a run-folder file refused, an output
that cannot be written, or a stop (Ctrl-C, SIGTERM, SIGHUP) no command caught each become one line
and the documented code. From the moment the command has ended every stop signal is ignored: what
it wrote stands, and the process leaves with ``os._exit`` (the interpreter's teardown, with torch and
the plotting modules loaded, takes most of a second and changes nothing the command wrote).
"""
from __future__ import annotations

import errno
import os
import sys

_MPLCONFIGDIR_GIVEN = os.environ.get("MPLCONFIGDIR")
"""The user's matplotlib folder, read before matplotlib is imported (it sets the variable to a folder of its own)."""


def _ticks_since_boot() -> int | None:
    """Now, in the clock ticks of ``/proc/PID/stat``'s start times: the kernel's boot-time clock
    (``/proc/uptime`` may count from a container's start instead, LXCFS); None off Linux."""
    import time

    try:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
    except (AttributeError, OSError, ValueError):
        return None


_ENTERED = _ticks_since_boot()
"""When the command line began (this module is imported first): a child started before it is the
caller's, one a shell started before ``exec``-ing the command (``monitor & exec fusedce-profile …``)."""

#: What an output that cannot take the command line's printing fails with: full, a closed pipe, gone, would block.
_OUTPUT_LOST = (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EAGAIN, errno.EBADF)


def _one_line_usage(error, file=None) -> None:
    """Click's refusal of the command line (an unknown option, a value its type refuses) as the tool
    words every refusal: one line on stderr, ``error: …``, naming the command's ``--help``."""
    names, ctx = [], error.ctx
    while ctx is not None and ctx.parent is not None:  # the sub-command's name(s), not how Python was started
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    where = " ".join(["fusedce-profile", *names])
    try:
        sys.stderr.write(f"error: {error.format_message()} (see {where} --help)\n")
        sys.stderr.flush()
    except OSError:  # an error output that cannot be written: the exit code still says it
        pass


def _unhandled_stop(exc: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C / SIGTERM / SIGHUP no command caught, behind the command line's exit ``exc``.

    A command catches a stop while it measures: it keeps what finished, says how to continue and
    exits with the signal's code (its exit raised ``from None``). A stop that reaches the command
    line (typer turns it into ``Exit(130) from`` the interrupt, whatever the signal) came outside
    that: before the command had a run folder (its option checks, a user module imported in a check
    worker), or after its last result was stored."""
    exit_ = exc.__context__
    stop = getattr(exit_, "__cause__", None)
    return stop if isinstance(stop, KeyboardInterrupt) else None


def _what_was_kept() -> str:
    """What a stop that reached the command line left: nothing, or the results stored (each as it
    finished) in the run folder the command held (:attr:`~fusedce_profiler.instrument.runlock.RunLock.taken`)."""
    from fusedce_profiler.instrument.runlock import RunLock
    from fusedce_profiler.instrument.store import DOCTOR_FILE, RECORDED_STEPS_FILE, RESULT_FILES
    from fusedce_profiler.instrument.text import one_line, same_command_resumed, shell_word

    if not RunLock.taken:
        return "before the command had anything to keep"
    folder = RunLock.taken[-1]
    if not any((folder / name).exists() for name in RESULT_FILES):
        return f"in {one_line(folder)} before anything had finished; run the command again"
    kept = (f"in {one_line(folder)}: what had finished is kept there; `fusedce-profile report {shell_word(folder)}` "
            "writes its report")
    if (folder / DOCTOR_FILE).exists() or (folder / RECORDED_STEPS_FILE).exists():  # neither is continued
        return kept
    return f"{kept}; continue with {same_command_resumed(folder)}"


def main() -> None:
    """Console-script entry point (``fusedce-profile``). A run-folder file the tool refuses that
    a command did not report itself is still one line and exit 2, never a traceback.

    Once the command has ended — its files closed, its workers stopped, its lock released — the
    process exits without the interpreter's teardown (``os._exit`` after flushing its output):
    with torch and the plotting modules loaded that teardown takes most of a second, at the end
    of every command, and changes nothing the command wrote."""
    from fusedce_profile.signals import interrupt_exit_code, signal_name

    from typer import core as typer_core

    clicks = [getattr(typer_core, "_click", None)]  # typer carries its own copy of click (0.2x)…
    try:
        import click  # … or uses the package (older typer); which one is installed varies

        clicks.append(click)
    except ImportError:
        pass
    for module in filter(None, clicks):
        module.exceptions.UsageError.show = _one_line_usage  # this process's command line only
    try:
        code = _command_code()
    except KeyboardInterrupt as late:  # a stop as the command line left, after the command's own handling
        _stop_signals_ignored()
        code = interrupt_exit_code(late)
        sys.stderr.write(f"fusedce-profile: stopped by {signal_name(late)} as the command ended {_what_was_kept()}\n")
    _end_helpers()
    if "matplotlib" in sys.modules:  # its temporary folders, if it made any: os._exit skips its own clean-up
        from fusedce_reports.matplotlib_folders import discard_temporary_config

        discard_temporary_config(_MPLCONFIGDIR_GIVEN)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): nothing more to say there
            pass
    os._exit(code)


def _command_code() -> int:
    """Run the parsed command; its exit code. A signal from the moment the command has ended is
    ignored (:func:`_stop_signals_ignored`): what it wrote stands, and the code is its own."""
    from fusedce_cli.app import app
    from fusedce_cli.usage import fail
    from fusedce_profile.signals import interrupt_exit_code, signal_name
    from fusedce_profile.exit_codes import RUN_FAILED
    from fusedce_profiler.instrument.confined import FolderRefused
    from fusedce_profiler.instrument.worker_errors import RunStopped

    try:
        try:
            app()
            code = 0
        except FolderRefused as exc:
            code = fail(str(exc)).exit_code
        except RunStopped as exc:  # a worker could not start or died at start-up (grid says so itself)
            from fusedce_profile.console import error

            error(f"{exc}; the run stopped {_what_was_kept()}")
            code = RUN_FAILED
        except OSError as exc:
            if exc.filename is not None or exc.filename2 is not None:  # a run folder's file (a full disk, say)
                from fusedce_profile.folders import describe_os_error

                code = fail(describe_os_error(exc)).exit_code
            elif exc.errno not in _OUTPUT_LOST:
                raise
            else:  # the command line's own printing (--help, usage) to a full or closed output
                code = 1
                try:
                    sys.stderr.write(f"fusedce-profile: the output could not be written ({os.strerror(exc.errno)})\n")
                except (OSError, ValueError):
                    pass
        except SystemExit as exc:
            if exc.code is not None and not isinstance(exc.code, int):
                raise  # a message to print: left to the interpreter
            code = exc.code or 0
            stop = _unhandled_stop(exc)
            if stop is not None:
                code = interrupt_exit_code(stop)
                sys.stderr.write(f"fusedce-profile: stopped by {signal_name(stop)} {_what_was_kept()}\n")
    finally:
        _stop_signals_ignored()
    return code


def _stop_signals_ignored() -> None:
    """Ctrl-C, SIGTERM and SIGHUP ignored for the rest of the process (its last milliseconds: the
    clean-up and the flush before ``os._exit``), so that none turns into a traceback there."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except ValueError:  # not the main thread (the command line called from another program)
            return


def _end_helpers() -> None:
    """Kill this process's children started since the command line began that are not worker
    templates, with their groups where they lead one. Once the command has ended its workers are
    closed and it runs nothing else, so such a child is a job's helper made the command's own
    (``clone`` with ``CLONE_PARENT`` from a fresh worker): outside every worker's tree, it would
    outlive the run. A template ends by itself, with its workers; an older child is the caller's."""
    from fusedce_profiler.instrument.proctable import children_of, kill_with_group, started
    from fusedce_profiler.instrument.template import template_pids

    templates = set(template_pids())  # by the pids it started: a helper can name itself a template
    for pid in children_of(os.getpid()):
        born = started(pid)
        if _ENTERED is not None and born is not None and born > _ENTERED and pid not in templates:
            kill_with_group(pid)
