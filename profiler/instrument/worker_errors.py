"""How a worker's failure is told: it died (at start-up or in a job), it could not be started, or its job raised.

:class:`WorkerDied` and :class:`JobFailed` carry one line for the terminal and the log to read;
:class:`WorkerNotStarted` is the operating system's refusal to make the worker at all (no file
descriptor, no process, no memory left), said as the limit to raise (:func:`refused_resource`).
"""
from __future__ import annotations

import errno
import os
import re
import resource
from pathlib import Path

from fusedce_profiler.instrument.text import one_line, shorten


class RunStopped(RuntimeError):
    """The run could not go on (the command line's exit 3): a worker process could not be started or
    died at start-up; the message, one line, says why. ``records``: what finished before it stopped,
    stored in the run folder (``resume=True`` continues once the cause is mended)."""

    def __init__(self, message: str, records: list | tuple = ()) -> None:
        super().__init__(message)
        self.records = list(records)


class WorkerDied(RuntimeError):
    """The child exited, was killed or timed out before it answered (``reason`` says which).

    ``summary`` is one line: the reason, the child's last words (the last line of its log,
    e.g. the exception that killed it) and where its log is; ``tail`` the log's last lines.
    ``at_start``: it died before it was ready for a job; ``over_memory``: it was killed for
    growing past the memory limit of its job.
    """

    def __init__(self, reason: str, log_path: Path, tail: str, timed_out: bool = False,
                 at_start: bool = False, over_memory: bool = False) -> None:
        self.reason, self.log_path, self.tail, self.timed_out = reason, log_path, tail, timed_out
        self.at_start, self.over_memory = at_start, over_memory
        self.summary = self.summary_in()
        super().__init__(self.summary + (f"\n{tail}" if tail else ""))

    def summary_in(self, folder: Path | None = None) -> str:
        """:attr:`summary`, naming the log relative to ``folder`` (a run folder); the log's last line
        as the cause, unless the worker was stopped for its time or memory limit."""
        last = self.tail.strip().splitlines()[-1].strip() if self.tail.strip() else ""
        quiet = self.timed_out or self.over_memory
        cause = f" ({last})" if last and not quiet else ""
        return f"{self.reason}{cause}; log {_log_in(self.log_path, folder)}"


def logs_named_from(message: str, folder: Path) -> str:
    """``message`` as stored (its worker logs named within the run ``folder``: :meth:`WorkerDied.summary_in`),
    each log named from where the command runs instead, for the terminal's line (``log logs/worker-1.log``
    → ``log run/logs/worker-1.log``): what a terminal prints opens from there (a newline in the folder's
    name spelled out, :func:`~fusedce_profiler.instrument.text.one_line`)."""
    return _STORED_LOG.sub(lambda found: f"log {one_line(Path(folder) / found.group(1))}", message)


def line_naming_log(message: str, folder: Path, width: int) -> str:
    """``message``'s first line for a terminal: shortened to about ``width`` characters
    (:func:`~fusedce_profiler.instrument.text.shorten`) but for its worker log, named whole from where the
    command runs (:func:`logs_named_from`): a long folder's path is never what the shortening cuts. The
    lines after the first (a traceback's tail) are the log's to show."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    found = _STORED_LOG.search(first)
    if found is None:
        return shorten(message, width)
    text = (first[:found.start()].rstrip("; ") + first[found.end():].rstrip(":")).strip()
    return f"{shorten(text, width)}; {logs_named_from(found.group(0), folder)}"


_STORED_LOG = re.compile(r"\blog (logs/[^\s;:,)]+\.log)")


def _log_in(log_path: Path, folder: Path | None) -> str | Path:
    """A worker's log as a message names it: relative to ``folder`` (a run folder), or as it is."""
    return os.path.relpath(log_path, folder) if folder is not None else log_path


class WorkerNotStarted(WorkerDied, RunStopped):
    """The operating system refused to make the worker (its log, its pipes or its process), or to
    run it with ``env`` (too large): every later worker would meet the same refusal, so the run
    cannot go on (:attr:`WorkerDied.at_start`). Nothing ran, so the line names no log."""

    def __init__(self, exc: OSError, log_path: Path, env: dict[str, str]) -> None:
        why = refused_resource(exc) or (too_large(env) if exc.errno == errno.E2BIG else os.strerror(exc.errno or 0))
        super().__init__(f"the worker (python -m fusedce_profiler.instrument.worker_child) could not be started: "
                         f"{why}", log_path, "", at_start=True)

    def summary_in(self, folder: Path | None = None) -> str:
        return self.reason


def run_stopped_by(died: WorkerDied, log_kept: bool = True) -> RunStopped:
    """A worker that died at start-up (or could not be started) as the run's stop: every later worker
    would meet the same end, and no job's code had run in it. ``log_kept=False``: its log was in a
    scratch folder removed since (a check's, a factory's), so the line does not name it."""
    if isinstance(died, RunStopped):
        return died
    return RunStopped(died.summary if log_kept else died.summary.rsplit("; log ", 1)[0])


#: Bytes the Linux kernel takes in one string of a new process's arguments or environment (32 pages).
MAX_ARG_STRLEN = 32 * 4096


def too_large(env: dict[str, str]) -> str:
    """Why a process could not be started with ``env`` (``E2BIG``): its largest variable, when that
    one string is over :data:`MAX_ARG_STRLEN`, else the environment's total size."""
    name, value = max(env.items(), key=lambda item: len(item[0]) + len(item[1]), default=("", ""))
    size = len(name.encode(errors="replace")) + len(value.encode(errors="replace")) + 2
    if size > MAX_ARG_STRLEN:
        return (f"the environment variable {name[:60]!r} holds {size:,} bytes, over the {MAX_ARG_STRLEN:,} a new "
                f"process takes in one string: shorten or unset it")
    total = sum(len(k.encode(errors="replace")) + len(v.encode(errors="replace")) + 2 for k, v in env.items())
    return (f"the environment ({len(env)} variables, {total:,} bytes) is over what a new process takes: "
            f"unset what it does not need")


#: The errors by which the operating system refuses a file descriptor, a process or the memory for one.
REFUSALS = (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM)


def refused_resource(exc: OSError) -> str | None:
    """The limit behind ``exc`` when it is the system refusing a resource (:data:`REFUSALS`), as the
    limit to raise; None for any other error (a file's own, said with its path)."""
    if exc.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return f"too many open files (this process's open-files limit, `ulimit -n`, is {soft}: raise it)"
    if exc.errno == errno.ENFILE:
        return "too many open files in the system (its table of open files is full)"
    if exc.errno == errno.EAGAIN:
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else soft
        return f"no process could be made (the process limit, `ulimit -u`, is {limit}, or the system's is reached)"
    if exc.errno == errno.ENOMEM:
        return "out of memory making the process (a memory limit, `ulimit -v`, or the machine's)"
    return None


class JobFailed(RuntimeError):
    """A job raised in the child (jobs normally turn failures into results themselves);
    the message's first line is the exception, then the child's traceback."""

    def __init__(self, kind: str, error: str, log_path: Path) -> None:
        self.kind, self.error, self.log_path = kind, error, log_path
        super().__init__(f"{self.summary_in()}:\n{error}")

    @property
    def cause(self) -> str:
        """The exception the job raised, in one line (the traceback's last)."""
        return self.error.splitlines()[-1] if self.error else "?"

    def summary_in(self, folder: Path | None = None) -> str:
        """The message's first line, naming the log relative to ``folder`` (a run folder)."""
        return f"job {self.kind} failed in the worker ({self.cause}); log {_log_in(self.log_path, folder)}"
