"""The worker template's own process: it imports the modules every worker imports, forks a worker
for each request of its parent (:mod:`~fusedce_profiler.instrument.template`, the parent's side and
the design), sends each worker's exit status, and ends when its parent does — ending the workers it
forked that are still alive.

**Its last act.** Its workers end on their own when the command does — the kernel's death signal
(``SIGTERM``), their watchdog thread, their reaper (:mod:`~fusedce_profiler.instrument.lifetime`) —
unless a job disabled all three: stopped the worker (``SIGSTOP``), or ignored ``SIGTERM`` and ended
the watchdog thread, and stopped or killed the reaper. The template, their parent, is out of the
jobs' reach, so it ends them itself (:func:`end_workers`):

1. ``SIGCONT``, then ``SIGTERM``, to each: a worker that can still act ends as it always does
   (:func:`~fusedce_profiler.instrument.lifetime.end_worker`: everything under it, the processes
   bearing its mark, its log scrubbed);
2. after :data:`END_WAIT_S`, ``SIGKILL`` to the process group of each one still alive (a worker
   leads a session of its own), then to every process bearing its mark
   (:func:`~fusedce_profiler.instrument.lifetime.kill_marked`: those of a worker that ended within
   the wait too, as a job's daemon may have killed it), and the log of each worker killed so
   scrubbed of the machine's names, as the worker would have;
3. ``SIGKILL`` to every other child of the template, with its process group where it leads one: the
   template starts nothing but workers and its keeper (:mod:`~fusedce_profiler.instrument.template_keeper`,
   which sees that a stopped template does not outlive the command), so such a child is a job's helper
   made the template's (``clone`` with ``CLONE_PARENT``), outside every worker's tree, whatever its
   mark or session.

Public API: :func:`serve_template`, :func:`end_workers`, :data:`END_WAIT_S`.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

from fusedce_profiler.instrument.lifetime import MARK_VARIABLE, kill_marked
from fusedce_profiler.instrument.proctable import children_of, kill_with_group, signal_quietly, started
from fusedce_profiler.instrument.template import REQUEST_BYTES
from fusedce_profiler.instrument.template_keeper import start_keeper
from fusedce_profiler.instrument.worker_log import scrub_log


def serve_template(sock_fd: int, preload: list[str], parent: int) -> int | list[str]:
    """The template process: import ``preload`` (modules), say it is ready, then fork a worker for
    each request and send each worker's exit status when it ends, until the socket ends or its
    parent (pid ``parent``) does — a fork of the parent may hold the parent's end of the socket
    after the parent's death. Returns 0 in the template when it ends; in a forked worker (which
    never comes back to this loop), the arguments it serves jobs with
    (:func:`~fusedce_profiler.instrument.worker_child.serve`), or 1 when it could not take its
    streams, environment or folder."""
    import importlib
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session; a stray Ctrl-C is not its end
    keeper = start_keeper(parent)
    sock = socket.socket(fileno=sock_fd)
    for module in preload:
        importlib.import_module(module)
    torch = sys.modules.get("torch")
    if threading.active_count() != 1 or (torch is not None and torch.cuda.is_initialized()):
        sock.send(json.dumps({"ready": False, "why": "a thread or a device was started by an import"}).encode())
        return 0
    sock.send(b'{"ready": true}')
    template, workers = os.getpid(), {}  # the workers forked and not yet waited for: pid → (mark, log)
    try:
        served = _serve_requests(sock, parent, workers)
    except OSError:  # the parent's end of the socket gone while a status was sent
        served = 0
    if os.getpid() == template:
        end_workers(workers, spare=keeper)
    return served


def _serve_requests(sock: socket.socket, parent: int, workers: dict[int, tuple[str, str | None]]
                    ) -> int | list[str]:
    """:func:`serve_template`'s loop, from its first request until its parent or the socket ends (0);
    in a forked worker, what :func:`_become_worker` returns."""
    import select
    import warnings

    while os.getppid() == parent:
        for pid, code in _reaped(workers):  # the workers that ended: their status, for the parent's poll()
            sock.send(json.dumps({"exited": pid, "status": code}).encode())
        if not select.select([sock], [], [], 0.05)[0]:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, 4)
        except OSError:
            return 0
        if not data:
            return 0
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            sock.send(b'{"error": "a request without its four descriptors"}')
            continue
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python 3.12 warns of forking beside torch's idle native thread
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            sock.close()
            return _become_worker(request, fds)
        workers[pid] = (str(request["env"].get(MARK_VARIABLE, "")), _path_of(fds[1]))
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
    return 0


def _become_worker(request: dict, fds: list[int]) -> int | list[str]:
    """In the forked child: take the worker's session, streams, environment, folder and
    ``sys.path`` (what a fresh start is given); its arguments for serving jobs, or 1."""
    import importlib

    try:
        os.setsid()
        # the descriptors to 0-4 (a target may hold another of them: each is moved clear first)
        moved = [os.dup(fd) for fd in fds]
        for fd in fds:
            os.close(fd)
        job_input, log, reply, life = moved
        for fd, target in ((job_input, 0), (log, 1), (log, 2), (reply, 3), (life, 4)):
            os.dup2(fd, target)
        for name in os.listdir("/proc/self/fd"):  # nothing else of the template's stays open
            if int(name) > 4:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        sys.path[:] = list(dict.fromkeys(request["path"] + sys.path))
        importlib.invalidate_caches()  # a module written since the template listed its folder is found
        from fusedce_profiler.instrument import lifetime

        lifetime.stamp_mark(os.environ[lifetime.MARK_VARIABLE])
        return [str(os.getppid()), *request["arguments"]]
    except BaseException:  # never back into the template's loop: the worker ends here
        import traceback

        traceback.print_exc()
        return 1


END_WAIT_S = 2.0
"""How long the workers get to end themselves before they are killed."""


def _path_of(fd: int) -> str | None:
    """The path of the file open as ``fd`` (a worker's log), or None."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return path if path.startswith("/") and not path.endswith(" (deleted)") else None


def _reaped(workers: dict[int, tuple[str, str | None]]) -> list[tuple[int, int]]:
    """Wait for every exited child: (pid, ``Popen.returncode``) of each; the workers among them
    leave ``workers``."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if not pid:
            return ended
        workers.pop(pid, None)
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def end_workers(workers: dict[int, tuple[str, str | None]], spare: int | None = None) -> None:
    """End the workers of ``workers`` (pid → (mark, log path); the template's children not yet
    waited for), as the module docstring says: the processes bearing each one's mark are killed
    whether the worker ended within the wait or not (a job's daemon may outlive a worker it killed),
    and the log of each worker killed here is scrubbed. The template's other children (step 3), but
    ``spare`` (its keeper, which dies with it), are killed first as well as last: a job's helper left
    alive through the wait could stop the template again, with no one left to continue it."""
    marked = [(mark, started(pid)) for pid, (mark, _) in workers.items()]  # before any pid can go
    logs = {pid: log for pid, (_, log) in workers.items()}

    def others() -> list[int]:
        return [pid for pid in children_of(os.getpid()) if pid not in workers and pid != spare]

    for pid in others():
        kill_with_group(pid)
    for pid in workers:
        signal_quietly(os.kill, pid, signal.SIGCONT)
        signal_quietly(os.kill, pid, signal.SIGTERM)
    deadline = time.monotonic() + END_WAIT_S
    while workers and time.monotonic() < deadline:
        _reaped(workers)
        time.sleep(0.02)
    killed = list(workers)
    for pid in killed + others():  # not waited for: its /proc entry stays, and its pid and group are not reused
        kill_with_group(pid)
    for mark, since in marked:
        if mark:
            kill_marked(mark, since=since)
    _reaped(workers)
    for pid in killed:  # the worker could not scrub its log; its reaper may be gone too
        scrub_log(logs[pid])
