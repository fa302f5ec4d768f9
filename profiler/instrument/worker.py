"""Worker processes: every measurement runs in a child Python process, never in the parent.

A :class:`Worker` starts ``python -m fusedce_profiler.instrument.worker_child`` (no CUDA context, allocator
state or compiled-kernel cache inherited): forked from this process's worker template, which has
imported torch once (:mod:`fusedce_profiler.instrument.template`), or as a fresh interpreter where
the template cannot serve it. It sends the child jobs, one JSON
line each on its stdin: ``{"kind": K, "payload": {...}, "id": T}``. The child answers each with one
JSON line on a private pipe: ``{"ok": true, "reply": ..., "id": T}`` or ``{"ok": false, "error": ...,
"id": T}``; a line of any other shape or token (the job's own code writing to the pipe) ends the
worker as :class:`WorkerDied`. The job's code runs in the child and can find its token: a reply it
forges is read against the job's shape by the caller (``read``), and the real reply arriving after
an accepted one is dropped, never taken as the next job's.
Its own stdout and stderr go to a log file, whose tail becomes the message when it dies
(a segfault, ``os._exit``, a CUDA error that aborts, the kernel's OOM killer). Once it has
started it says so (``{"ready": true}``) before it reads its first job, so a child that dies
at start-up (its interpreter cannot import what it needs) is told apart from a job that
killed it: :attr:`WorkerDied.at_start`.

Job kinds (:data:`JOBS`): a grid ``cell``, model-mode ``training-step(s)``, the ``environment``, a
user's model factory (``describe-model``) and loss wrapper (``doctor``) called in a box, a
``parity-curve``, a user back-end's ``check-backend``.

Lifetime (:mod:`fusedce_profiler.instrument.lifetime` tells how): the child runs in its own
session (Ctrl-C and SIGTERM at the terminal reach only the parent, which stops the child and keeps
its results valid), and everything under it dies with its parent, ``kill -9`` included: a *reaper*
it forks waits on a *life pipe* only the parent writes, the kernel's death signal and a watchdog
thread end it, it adopts the daemons its jobs start, and every process under it bears its mark.
:meth:`Worker.close` ends its input (the worker kills what it started and exits), sends SIGTERM
to a worker still busy, then kills its group and every process that bears its mark.

Start-up: ``preload`` job kinds are imported and the ``warm_up`` callables run (such as the CPU
profiler's first start) before the child says it is ready, so a job's time limit never counts a
fresh worker's imports. The child ends without the interpreter's teardown (``os._exit`` once its
output is flushed, as :mod:`multiprocessing`'s children do: with torch loaded the teardown takes
most of a second, which the parent would wait for at every worker's end).

Public API: :class:`Worker`, :class:`WorkerDied`, :class:`JobFailed`, :data:`JOBS`, :func:`default_max_rss_bytes`.
"""
from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fusedce_profiler.instrument.lifetime import MARK_VARIABLE, kill_marked
from fusedce_profiler.instrument.proctable import started
from fusedce_profiler.instrument.scrub import current_folder
from fusedce_profiler.instrument.template import forked_worker, start_folder
from fusedce_profiler.instrument.memory_guard import TreeMeter, default_max_rss_bytes  # noqa: F401 - part of this API
from fusedce_profiler.instrument.text import one_line
from fusedce_profiler.instrument.worker_errors import (REFUSALS, JobFailed, WorkerDied, WorkerNotStarted,  # noqa: F401
                                                       run_stopped_by)
from fusedce_profiler.instrument.worker_log import describe_exit, disk_full, log_incomplete, log_tail

T = TypeVar("T")

#: kind → "module:function" taking the payload dict and returning a JSON-serialisable value.
JOBS = {
    "cell": "fusedce_profiler.grid.cell:run_cell_job",
    "training-step": "fusedce_profiler.instrument.step.jobs:run_training_job",
    "training-steps": "fusedce_profiler.instrument.step.jobs:run_training_jobs",
    "environment": "fusedce_profiler.instrument.environment:environment_job",
    "describe-model": "fusedce_profiler.instrument.models.factory:describe_job",
    "doctor": "fusedce_profiler.judgements.doctor.job:run_doctor_job",
    "parity-curve": "fusedce_profiler.judgements.parity_training:run_curve_job",
    "check-backend": "fusedce_profiler.instrument.backends.check:check_job",
}

_MAX_REPLY_BYTES = 256 << 20  # a reply is a few MiB at most (a parity curve's losses)
_START_TIMEOUT_S = 300.0  # how long a child may take to start (import the standard library and this module)


def _parsed(line: bytes) -> object:
    """A reply line's JSON (``None`` for a line that is not JSON)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _reply(answer: object, token: str) -> dict | None:
    """The child's answer to the job sent with ``token`` (``answer``: a reply line's JSON,
    :func:`_parsed`); ``None`` for any other line."""
    ok = isinstance(answer, dict) and answer.get("id") == token and (
        "reply" in answer if answer.get("ok") is True else answer.get("ok") is False and "error" in answer)
    return answer if ok and isinstance(answer.get("error", ""), str) else None


class Worker:
    """One child process; :meth:`call` runs a job in it and returns the job's reply."""

    def __init__(self, log_dir: Path, env: dict | None = None, preload: tuple[str, ...] = (),
                 warm_up: tuple[str, ...] = ()) -> None:
        from fusedce_profiler.instrument.confined import open_inside

        self._start = (log_dir, env, preload, warm_up, current_folder() is not None)  # wait_ready may start it again
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"worker-{os.getpid()}-{time.monotonic_ns()}.log"
        unknown = [kind for kind in preload if kind not in JOBS]
        if unknown:
            raise ValueError(f"unknown job kind(s) to preload: {', '.join(unknown)}; known: {', '.join(JOBS)}")
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        self._mark = child_env[MARK_VARIABLE] = f"{os.getpid()}-{time.monotonic_ns()}"  # lifetime.kill_marked
        # The child imports what the parent can (a user's back-end module on a path added at
        # run time): it gets the parent's sys.path ahead of its own.
        paths = [p for p in sys.path if p] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p]
        child_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        made: list[int] = []  # the descriptors made for the child: the parent keeps only its ends
        try:
            # opened without following a link at logs/ or at the file: a log never leaves its folder
            made.append(log := open_inside(log_dir.parent, self.log_path,
                                           os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOCTTY))
            made.extend(ends := os.pipe())
            made.extend(life := os.pipe())  # the parent alone holds the write end (see the module docstring)
            (read_end, write_end), (life_read, self._life) = ends, life
            self._process = forked_worker(child_env, log, write_end, life_read, preload, warm_up)
            if self._process is None:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "fusedce_profiler.instrument.worker_child", str(os.getpid()),
                     str(write_end), str(life_read), ",".join(preload), ",".join(warm_up)],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_end, life_read),
                    start_new_session=True, env=child_env, cwd=start_folder())
        except OSError as exc:
            for fd in made:
                os.close(fd)
            if exc.errno in REFUSALS or exc.errno == errno.E2BIG:  # no later worker could start either
                raise WorkerNotStarted(exc, self.log_path, child_env) from None
            raise
        for fd in (log, write_end, life_read):
            os.close(fd)
        self._since = started(self._process.pid)  # lifetime.kill_marked: none of its processes is older
        self._meter = TreeMeter(self._process.pid, self._mark)  # the memory guard's reading
        self._replies = os.fdopen(read_end, "rb")
        self._buffer = bytearray()
        self._ready = False
        self._in_job = False  # a job was sent and its reply not read
        self._jobs_sent = 0  # the child logs a header line for each before running it
        self._max_rss: int | None = None
        self._over_memory = False
        self._garbled = False  # the reply pipe filled with bytes that are no reply
        self._answered: set[str] = set()  # the tokens of the jobs that had their answer
        self.tenant: str | None = None  # the user back-end that ran in this worker, if one did (:meth:`serves`)

    @property
    def pid(self) -> int:
        return self._process.pid

    def serves(self, tenant: str | None) -> bool:
        """Whether a job of ``tenant`` (a user back-end's name; ``None``: the tool's own code) may run
        here. Once a user back-end has run in a worker, the worker runs its jobs alone: its code can
        alter its process (replace the tool's functions, close the standard streams) and return
        normally, and that must touch no other back-end's measurement (:meth:`kept_for`)."""
        return self.tenant is None or self.tenant == tenant

    @staticmethod
    def kept_for(worker: Worker | None, tenant: str | None) -> Worker | None:
        """``worker`` if it :meth:`serves` ``tenant``; else ``worker`` closed and ``None`` (start another)."""
        if worker is not None and not worker.serves(tenant):
            worker.close()
            return None
        return worker

    def call(self, kind: str, payload: dict | None = None, timeout_s: float | None = None,
             max_rss_bytes: int | None = None, read: Callable[[object], T] | None = None,
             tenant: str | None = None) -> T:
        """Run job ``kind`` on ``payload`` in the child; its reply, or :class:`WorkerDied`.

        ``tenant``: the user back-end the job runs, if any; it makes this worker its own (:meth:`serves`).

        ``read`` turns the reply (parsed JSON) into what the caller uses, raising on a reply of
        another shape: the job runs user code, which can find the job's token and write a reply
        of its own, so a reply that ``read`` refuses is the worker's failure (:class:`WorkerDied`,
        the worker closed), never an exception of the caller's.

        A job that raises in the child is re-raised here as :class:`JobFailed` with the
        child's traceback (jobs normally turn failures into results themselves).
        ``timeout_s`` bounds the job; the child's start-up has a bound of its own.
        ``max_rss_bytes``: the memory of the child and every process under it
        (:class:`~fusedce_profiler.instrument.memory_guard.TreeMeter`) is watched while the job runs, and
        the child killed when it grows past this (:attr:`WorkerDied.over_memory`).
        """
        if kind not in JOBS:
            raise ValueError(f"unknown job kind {kind!r}; known: {', '.join(JOBS)}")
        if not self.serves(tenant):
            raise RuntimeError(f"this worker ran the user back-end {self.tenant}; a job of {tenant} needs another")
        self.wait_ready()
        self.tenant = tenant or self.tenant
        token = os.urandom(8).hex()  # the reply carries it; a line the job's own code wrote to the pipe does not
        message = json.dumps({"kind": kind, "payload": payload or {}, "id": token}) + "\n"
        self._in_job = True
        self._jobs_sent += 1
        try:
            self._process.stdin.write(message.encode())
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died(timed_out=False) from None
        self._max_rss = max_rss_bytes
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                line, timed_out = self._read_line(None if deadline is None else max(0.0, deadline - time.monotonic()))
                parsed = None if line is None else _parsed(line)
                # the reply of a job already answered: its own, come after one the job's code forged with
                # the token it found (a late reply, dropped)
                if not (isinstance(parsed, dict) and parsed.get("id") in self._answered):
                    break
        finally:
            self._max_rss = None
        self._in_job = line is None
        if line is None:
            if self._garbled:
                self.close()
                raise WorkerDied(f"the worker's reply pipe carried more than {_MAX_REPLY_BYTES >> 20} MiB without a "
                                 "line end (the job's code wrote to it)", self.log_path, log_tail(self.log_path))
            if self._over_memory:
                self.close()
                raise WorkerDied(f"the worker (with the processes it started) grew past the memory limit of "
                                 f"{max_rss_bytes / 2**30:.3g} GiB and was killed", self.log_path,
                                 log_tail(self.log_path), over_memory=True)
            raise self._died(timed_out=timed_out)
        answer = _reply(parsed, token)
        if answer is None:  # the channel is out of step: nothing more it carries can be trusted
            self.close()
            raise WorkerDied("the worker's reply pipe carried a line the tool did not write (the job's code "
                             "wrote to it)", self.log_path, log_tail(self.log_path))
        self._answered.add(token)
        if not answer["ok"]:
            raise JobFailed(kind, answer["error"].strip(), self.log_path)
        if read is None:
            return answer["reply"]
        try:
            return read(answer["reply"])
        except Exception as exc:  # noqa: BLE001 - any reply the reader cannot take is the worker's fault
            self.close()
            raise WorkerDied(f"the worker's reply to the {kind} job did not have its shape ({one_line(exc)}; the "
                             "job's code wrote to the reply pipe?)", self.log_path, log_tail(self.log_path)) from None

    def wait_ready(self) -> None:
        """Wait until the child has started (its ``preload`` imported): :class:`WorkerDied` with
        ``at_start`` if it dies or takes longer than its own start-up bound first. A child that died
        as the command's current folder was removed (torch's import in a removed folder kills it,
        :func:`~fusedce_profiler.instrument.template.start_folder`) is started once more, in the root."""
        if not self._ready:
            line, timed_out = self._read_line(_START_TIMEOUT_S)
            if line is None:
                died = self._died(timed_out=timed_out, at_start=True)
                *arguments, folder_then = self._start
                if timed_out or not folder_then or current_folder() is not None:
                    raise died
                self.__init__(*arguments)  # the folder is gone now: this start is in the root
                return self.wait_ready()
            self._ready = True

    def _read_line(self, timeout_s: float | None) -> tuple[bytes | None, bool]:
        """(the next reply line, or ``None`` if the child ended or the time ran out; whether it ran out)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self._replies.fileno()
        poll = 0.5 if self._max_rss is None else 0.05
        scanned = 0  # bytes of the buffer already searched for the line's end
        while (end := self._buffer.find(b"\n", scanned)) < 0:
            scanned = len(self._buffer)
            if scanned > _MAX_REPLY_BYTES:  # the job's code writes to the pipe without end
                self._garbled = True
                return None, False
            if deadline is not None and time.monotonic() >= deadline:  # also while bytes keep coming
                return None, True
            if self._max_rss is not None and self._meter() > self._max_rss:
                self._over_memory = True
                return None, False
            wait = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # the child closed its end: it has exited
                    try:
                        self._process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                    return None, False
                self._buffer += chunk
            elif self._process.poll() is not None:
                return None, False
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 1]
        return line, False

    def _died(self, timed_out: bool, at_start: bool = False) -> WorkerDied:
        """The worker's end as :class:`WorkerDied`; ``OSError`` (no space left, naming its log) when it
        died without a word on a full disk and its log lacks what it had to write (a job's header, or
        anything at start-up): it could not write its log, which is no failure of the job. A job that
        ends its worker silently on a nearly full disk, its header written, is the job's failure."""
        self.close()
        tail = log_tail(self.log_path)
        if (not timed_out and not tail and log_incomplete(self.log_path, self._jobs_sent)
                and disk_full(self.log_path.parent)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.log_path))
        reason = "timed out" if timed_out else describe_exit(self._process.returncode)
        if at_start:
            reason = f"the worker (python -m fusedce_profiler.instrument.worker_child) died at start-up: {reason.removeprefix('the worker ')}"
        return WorkerDied(reason, self.log_path, tail, timed_out=timed_out, at_start=at_start)

    def close(self) -> None:
        """Stop the child: end its input, then kill its process group if it lingers. A child still
        in a job (out of time or memory, or the parent interrupted) would not read the end of its
        input: it is sent SIGTERM at once."""
        busy = self._in_job
        if self._process.poll() is None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
            try:
                self._process.wait(timeout=0 if busy else 2)
            except subprocess.TimeoutExpired:
                pass
        if self._process.poll() is None:  # busy in a job: SIGTERM lets it end the daemons it adopted
            try:
                self._process.send_signal(signal.SIGTERM)
                self._process.wait(timeout=3)  # its handler walks and kills what is under it
            except (subprocess.TimeoutExpired, OSError):
                pass
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._process.kill()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # killed, but not reaped yet by whoever is its parent
                pass
        else:  # the child is gone; helpers it started in its session (and its reaper) go too
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_marked(self._mark, since=self._since)  # a daemon orphaned when it died, or one that outran its walk
        try:
            self._replies.close()
        except OSError:
            pass
        if self._life >= 0:
            os.close(self._life)  # the child's group is gone: its reaper has nothing left to wait for
            self._life = -1
        from fusedce_profiler.instrument.scrub import scrub_file

        scrub_file(self.log_path.parent.parent, self.log_path)  # a run folder names no machine path

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
