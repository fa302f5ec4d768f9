"""The worker template: one pre-imported interpreter per process that starts workers, forking each
worker instead of starting a fresh interpreter that imports torch again (2–3 s of CPU a worker).

**What a worker keeps.** A forked worker is the worker a fresh start makes, everywhere the tool can
tell: the template imports modules only (torch and every job kind's module of
:data:`~fusedce_profiler.instrument.worker.JOBS`, which every worker imports) and runs nothing — no tensor op, no
Python thread, no CUDA context, no allocator state, no compiled kernel exists in it to inherit; it
says so when it is ready, or it is not used. (``import torch`` starts one idle native thread; a
fork copies only the forking thread, as in PyTorch's own forked data-loader workers.) The worker
then takes its own session, its standard streams (the job pipe and its log), its environment and
the parent's ``sys.path`` as a fresh start is given them, and runs the same serving loop
(:func:`~fusedce_profiler.instrument.worker_child.serve`), warm-ups included, before it says it is
ready.

**Whose child it is.** The template's: it waits for each worker and sends the parent its exit
status (a segfault, the OOM killer's signal), which :class:`ForkedProcess` reads as
:class:`subprocess.Popen` does. The worker's parent-death signal and watchdog watch the template,
which ends when the parent does; its reaper waits on the parent's life pipe and its mark is its own
(:func:`~fusedce_profiler.instrument.lifetime.stamp_mark`), as a fresh worker's. A forked worker's
command line (``ps``) stays the template's: a worker is the template's child, a template the command's.

**When a worker starts fresh instead.** Not on Linux; ``FUSEDCE_WORKER_TEMPLATE=0``; a template
that failed to start (a process starts at most :data:`MAX_STARTS`); a ``PYTHONPATH`` holding a
start-up hook (``sitecustomize.py``, ``usercustomize.py``) other than the Python installation's own,
which a fresh interpreter runs (:mod:`~fusedce_profiler.instrument.startup_hooks`); a request larger
than :data:`MESSAGE_BYTES` (an environment of more than about 190 KiB): no template is started or
blamed for it. A worker
is forked only from a template whose environment equals its own in every variable read when an interpreter, torch,
Triton or a maths library starts (:func:`import_time_variables`: those would not take effect in
an interpreter that has already started); a process keeps a template for each of at most
:data:`MAX_TEMPLATES` such sets at a time.

**Lifetime.** The template runs in its own session and reads requests on a socket whose other end
only its parent holds; the end of that socket (the parent's exit, ``kill -9`` included) ends it, and
so does the parent's death while a fork of the parent still holds that end. Workers never hold it.
Ending, it ends the workers it forked that still live (a job may have stopped one, and its reaper).

The template process's own side (its loop, its forks, its end): :mod:`~fusedce_profiler.instrument.template_process`.

Public API: :func:`forked_worker`, :func:`template_for`, :func:`template_pids`, :func:`close_template`,
:data:`MAX_TEMPLATES`, :data:`MAX_STARTS`, :class:`ForkedProcess`,
:func:`import_time_variables`, :data:`SWITCH`, :data:`REQUEST_BYTES`.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from fusedce_profiler.instrument.lifetime import MARK_PLACEHOLDER, MARK_VARIABLE, end_template
from fusedce_profiler.instrument.proctable import stopped
from fusedce_profiler.instrument.scrub import current_folder
from fusedce_profiler.instrument.startup_hooks import startup_hooks

SWITCH = "FUSEDCE_WORKER_TEMPLATE"
"""``0`` in the environment: every worker starts as a fresh interpreter."""

_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TORCH", "PYTORCH", "TRITON", "CUDA", "NVIDIA", "OMP_", "MKL", "KMP_",
                         "GOMP_", "OPENBLAS", "MALLOC", "NCCL", "HIP", "ROCM", "DNNL", "ONEDNN", "XDG_CACHE")
_APPLIED_AT_FORK = {"PYTHONPATH", "PYTHONUNBUFFERED"}  # the fork sets these itself
_START_TIMEOUT_S = 300.0  # a template's start
REQUEST_BYTES = 1 << 20
"""The most bytes the template reads as one message on its socket."""
MESSAGE_BYTES = 192 << 10
"""The largest request (environment, ``sys.path``, arguments) sent to a template: one message on its
socket must fit the socket's send buffer, by default Linux's ``net.core.wmem_default`` (212,992 bytes,
which held 210,000 and refused 220,000 with ``EMSGSIZE``), less room for the kernel's own bytes."""


def import_time_variables(env: dict) -> dict:
    """The variables of ``env`` read when an interpreter, torch, Triton or a maths library starts
    (by name prefix), but the two the fork sets itself."""
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME_PREFIXES) and k not in _APPLIED_AT_FORK}


class ForkedProcess:
    """A forked worker (the template's child), with the part of :class:`subprocess.Popen`'s API the
    worker uses: ``pid``, ``stdin``, ``returncode``, :meth:`poll`, :meth:`wait`, :meth:`send_signal`,
    :meth:`kill`. Its exit status comes from the template, which waits for it."""

    def __init__(self, pid: int, stdin, template: "_Template") -> None:
        self.pid, self.stdin, self.returncode, self._template = pid, stdin, None, template

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._template.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                if self._template.stopped():  # a job stopped it (SIGSTOP to its parent): no status comes
                    template_failed(self._template)  # killed, and replaced for the next worker
                    deadline = time.monotonic() + 1.0  # for init to reap the worker it left
                    continue
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Template:
    """The parent's side: the template process, the socket its requests and answers go through,
    and the exit statuses of its workers it has sent (pid → ``Popen.returncode``)."""

    def __init__(self, env: dict) -> None:
        self.owner, self.variables, self.statuses, self.ended = os.getpid(), import_time_variables(env), {}, False
        self.running: set[int] = set()  # its workers not yet known to have exited
        self.lock = threading.RLock()  # one request and its answer at a time (a multi-device grid's threads)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fusedce_profiler.instrument.worker_child", "template",
                 str(os.getpid()), str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True, env=env, cwd=start_folder())
        finally:
            theirs.close()
        self.socket = ours
        try:
            ready = self._receive(_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if ready != {"ready": True}:
            self.close()
            raise OSError(f"the worker template did not start: {ready!r}")

    def _next(self, timeout_s: float | None) -> dict | None:
        """The next message (``None``: none within ``timeout_s``); a worker's exit status is kept."""
        self.socket.settimeout(timeout_s)
        try:
            data = self.socket.recv(REQUEST_BYTES)
        except (BlockingIOError, TimeoutError):
            return None
        if not data:
            self.ended = True
            raise OSError("the worker template ended")
        message = json.loads(data)
        if isinstance(message, dict) and set(message) == {"exited", "status"}:
            self.statuses[message["exited"]] = message["status"]
            self.running.discard(message["exited"])
            return {}
        return message

    def _receive(self, timeout_s: float) -> object:
        """The next message that is not an exit status; ``OSError`` when none comes in time."""
        deadline = time.monotonic() + timeout_s
        while (message := self._next(max(0.0, deadline - time.monotonic()))) == {}:
            pass
        if message is None:
            raise OSError(f"the worker template did not answer within {timeout_s:g} s")
        return message

    def _drain(self) -> None:
        """Take the exit statuses the template has sent (without waiting)."""
        try:
            while not self.ended and self._next(0.0) is not None:
                pass
        except OSError:
            pass

    def exit_status(self, pid: int) -> int | None:
        """Worker ``pid``'s ``returncode`` once it has exited (``None`` while it runs). A template
        that ended (killed) left its workers to init: one gone then counts as killed."""
        with self.lock:
            self._drain()
            if pid in self.statuses:
                return self.statuses.pop(pid)
            if self.ended and not os.path.exists(f"/proc/{pid}"):
                return -signal.SIGKILL
            return None

    def fork(self, request: bytes, fds: tuple[int, int, int, int]) -> int:
        """Fork a worker of ``request`` (:func:`_fork_request`); ``fds``: (job input, log, reply pipe,
        life pipe)."""
        with self.lock:
            socket.send_fds(self.socket, [request], list(fds))
            answer = self._receive(30.0)
            if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
                raise OSError(f"the worker template could not fork: {answer!r}")
            self.running.add(answer["pid"])
            return answer["pid"]

    def usable(self) -> bool:
        """Whether it still serves (it may have been killed)."""
        return not self.ended and self.process.poll() is None

    def idle(self) -> bool:
        """Whether none of its workers runs (closing it then ends none)."""
        with self.lock:
            self._drain()
            return not self.running

    def stopped(self) -> bool:
        """Whether the template is stopped (``SIGSTOP`` from one of its workers: it reaps none)."""
        return stopped(self.process.pid)

    def close(self) -> None:
        """End the template: with its socket closed it ends its workers and their helpers itself,
        continued whenever a job's helper stops it (:func:`~fusedce_profiler.instrument.lifetime.end_template`)."""
        self.socket.close()
        self.ended = True  # its workers' statuses come no more: one gone counts as killed
        end_template(self.process.pid)
        self.process.wait()


MAX_TEMPLATES = 2
"""Templates one process keeps at a time, one per set of start-time variables (a CPU grid's workers
run with malloc and OpenMP settings of their own); a third set replaces one whose workers have all
ended, or starts its worker fresh."""

MAX_STARTS = 6
"""Templates one process starts in all (one killed or replaced is started again, this often)."""

_TEMPLATES: dict[frozenset, _Template] = {}
_CHOOSING = threading.RLock()  # one thread at a time picks, starts, replaces or drops a template
_OWNER = os.getpid()  # whose templates _TEMPLATES holds (a fork of this process holds none)
_starts = 0


def template_for(env: dict) -> _Template | None:
    """The template a worker of environment ``env`` is forked from, started now if need be (see the
    module docstring); ``None``: start the worker fresh."""
    global _OWNER, _starts
    if _OWNER != os.getpid():  # a forked copy of this module's state: those templates are not ours
        _TEMPLATES.clear()
        _OWNER, _starts = os.getpid(), 0
    if (env.get(SWITCH, os.environ.get(SWITCH)) == "0" or sys.platform != "linux"
            or startup_hooks(env.get("PYTHONPATH", ""))):
        return None
    with _CHOOSING:
        return _chosen(frozenset(import_time_variables(env).items()), env)


def _chosen(key: frozenset, env: dict) -> _Template | None:
    global _starts  # (under _CHOOSING)
    template = _TEMPLATES.get(key)
    if template is not None and not template.usable():
        template_failed(template)
        template = None
    if template is None:
        idle = [k for k, t in _TEMPLATES.items() if t.idle()]
        if _starts >= MAX_STARTS or (len(_TEMPLATES) >= MAX_TEMPLATES and not idle):
            return None
        if len(_TEMPLATES) >= MAX_TEMPLATES:
            _TEMPLATES.pop(idle[0]).close()
        _starts += 1
        try:
            template = _TEMPLATES[key] = _Template({**env, MARK_VARIABLE: MARK_PLACEHOLDER})
        except (OSError, ValueError):
            return None
    return template


def template_failed(template: _Template) -> None:
    """``template`` could not fork a worker (or was found ended): it is closed and dropped."""
    with _CHOOSING:
        for key in [key for key, kept in _TEMPLATES.items() if kept is template]:
            del _TEMPLATES[key]
    template.close()


def template_pids() -> list[int]:
    """The pids of this process's templates (which live as long as it does, by design)."""
    return [t.process.pid for t in _TEMPLATES.values()] if _OWNER == os.getpid() else []


def close_template() -> None:
    """End this process's templates (at exit, or before a count of the processes left behind)."""
    if _OWNER == os.getpid():
        while _TEMPLATES:
            _TEMPLATES.popitem()[1].close()


atexit.register(close_template)


def forked_worker(env: dict, log_fd: int, reply_end: int, life_end: int, preload: tuple[str, ...],
                  warm_up: tuple[str, ...]) -> ForkedProcess | None:
    """A worker (:class:`~fusedce_profiler.instrument.worker.Worker`'s child) forked from this
    process's template, writing to ``log_fd``, replying on ``reply_end``, its life pipe
    ``life_end``; ``None``: start it fresh (see the module docstring)."""
    request = _fork_request(["3", "4", ",".join(preload), ",".join(warm_up)], env)
    template = template_for(env) if len(request) <= MESSAGE_BYTES else None
    if template is None:
        return None
    job_input, job_output = os.pipe()
    try:
        pid = template.fork(request, (job_input, log_fd, reply_end, life_end))
    except (OSError, ValueError):
        template_failed(template)
        os.close(job_output)
        return None
    finally:
        os.close(job_input)
    return ForkedProcess(pid, os.fdopen(job_output, "wb"), template)


def _fork_request(arguments: list[str], env: dict) -> bytes:
    """A template's request for one worker: ``arguments``, the worker's command line after its parent
    (the template), with its reply and life pipes at fds 3 and 4; its environment ``env``; this
    process's current folder (the root where it was removed, :func:`start_folder`) and ``sys.path``
    with ``env``'s ``PYTHONPATH``."""
    path = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return json.dumps({"arguments": arguments, "env": env, "cwd": current_folder() or os.sep,
                       "path": list(dict.fromkeys(path))}).encode()


def start_folder() -> str | None:
    """The folder a new worker or template starts in: this process's (None: inherited), or the root
    once that was removed during the run — torch's import in a removed folder kills the interpreter
    (MKL's loader: "Cannot load libtorch_cpu.so"; torch's compiler calls ``os.getcwd``)."""
    return None if current_folder() is not None else os.sep
