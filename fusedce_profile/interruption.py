"""What a command does when Ctrl-C or SIGTERM stops it: keep what finished, write the report of it
marked *interrupted*, say how to continue, and end with 130 or 143."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fusedce_profile.outcome import CommandOutcome
from fusedce_profile.signals import interrupt_exit_code, signal_name
from fusedce_profiler.instrument.interruption import Interruption, mark_interrupted


def interrupted_outcome(out_dir: Path, stopped: KeyboardInterrupt, records: list, finished: str,
                        continue_with: str, write_report: Callable[[Path], object],
                        say: Callable[[str], None]) -> CommandOutcome:
    """Mark ``out_dir`` interrupted, rebuild its report with ``write_report`` (which reads the mark),
    print where it is and ``continue with …``; the outcome carries ``stopped`` and its exit code.
    ``finished``: how much had finished (``"3 of 5 jobs"``); ``continue_with``: what continues it."""
    signal = signal_name(stopped)
    mark_interrupted(out_dir, Interruption(signal, finished, continue_with))
    written = write_report(out_dir)
    report = written[0] if isinstance(written, tuple) else written
    say(f"\nInterrupted after {finished}; report {report}; continue with {continue_with}")
    return _stopped(out_dir, stopped, records)


def report_stopped(out_dir: Path, stopped: KeyboardInterrupt, records: list, finished: str,
                   say: Callable[[str], None]) -> CommandOutcome:
    """A signal while the report of a whole run was being written: every result is stored (each as it
    finished), the report's files may be the previous ones; say so, and how to write the report.
    ``finished``: what the results are (``"4 cells"``)."""
    from fusedce_profiler.instrument.text import shell_word

    say(f"\nStopped by {signal_name(stopped)} while the report was written; every result is kept ({finished}); "
        f"write the report with `fusedce-profile report {shell_word(out_dir)}`")
    return _stopped(out_dir, stopped, records)


def _stopped(out_dir: Path, stopped: KeyboardInterrupt, records: list) -> CommandOutcome:
    """The outcome of a command ``stopped`` by a signal: its exit code, and the ``--json`` summary saying so."""
    code = interrupt_exit_code(stopped)
    return CommandOutcome(records, code, {"out": str(out_dir), "interrupted": signal_name(stopped), "exit_code": code},
                          stopped)

