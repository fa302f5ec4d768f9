"""What a worker that ended left behind, read for its message: the last lines of its log, how it
exited, and whether its disk was full (:mod:`fusedce_profiler.instrument.worker`); and its log
scrubbed of the machine's names by the worker and its reaper when the command died before it could
(:mod:`fusedce_profiler.instrument.lifetime`)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

LOG_TAIL_LINES = 15
"""Lines of a dead worker's log its message carries."""

JOB_HEADER = "--- job "
"""How the child's log line before each job begins (``worker_child``)."""

_NOT_LAST_WORDS = (
    JOB_HEADER,  # the child's own line before each job
    "USDT:",  # the CPU profiler's chatter
    # a compiled extension's leak report, printed as the interpreter exits whatever ended it
    "nanobind: ", " - leaked ", " - ... skipped remainder", "See https://nanobind.",
)
"""Log lines that are never what ended a worker, so never named as its cause."""


def log_tail(path: Path) -> str:
    """The last :data:`LOG_TAIL_LINES` lines of a worker's log that can say what ended it ("" if none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.strip().splitlines() if not line.startswith(_NOT_LAST_WORDS)]
    return "\n".join(lines[-LOG_TAIL_LINES:])


def log_incomplete(path: Path, jobs_sent: int) -> bool:
    """Whether a worker's log lacks what its child had to write: a :data:`JOB_HEADER` line for each
    of the ``jobs_sent`` jobs, or, where none was sent, any byte (a log that cannot be read: True)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return True
    if jobs_sent == 0:
        return not text
    return sum(line.startswith(JOB_HEADER) for line in text.splitlines()) < jobs_sent


def disk_full(folder: Path) -> bool:
    """Whether the file system of ``folder`` has less than 64 KiB left (a worker's log cannot be written)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 64 << 10


def describe_exit(code: int | None) -> str:
    """How a worker with exit status ``code`` ended, in words (``None``: it is still running)."""
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        try:
            return f"the worker was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker was killed by signal {-code}"
    return f"the worker exited with code {code}"


def log_of_stdout() -> str | None:
    """The file this process's standard output goes to (a worker's log), ``None`` when it is no file."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isabs(path) and os.path.isfile(path) else None


def scrub_log(log: str | None) -> bool:
    """Rewrite the worker's log ``log`` (in ``RUN/logs/``) without the machine's names, as the
    command does when it closes a worker (:func:`~fusedce_profiler.instrument.scrub.scrub_file`);
    whether that was done (no log: nothing to do)."""
    if log is None:
        return True
    from fusedce_profiler.instrument.scrub import scrub_file

    return scrub_file(os.path.dirname(os.path.dirname(log)), log)


def release_log_locks(log: str | None) -> None:
    """Drop every ``flock`` this process holds on the file ``log`` (a job's code can lock its own
    standard output, the log: the scrub would then wait for a lock no one gives up)."""
    import fcntl

    if log is None:
        return
    try:
        target = os.stat(log)
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in descriptors:
        try:
            if os.path.samestat(os.fstat(fd), target):
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            continue
