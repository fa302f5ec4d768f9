"""The worker's child side: ``python -m fusedce_profiler.instrument.worker_child PARENT REPLY_FD LIFE_FD
PRELOAD WARM_UP`` — serve the jobs of :data:`~fusedce_profiler.instrument.worker.JOBS` read from stdin,
one JSON reply line each on the private pipe ``REPLY_FD`` (the protocol, the lifetime and the start-up
are described in :mod:`fusedce_profiler.instrument.worker`).

``python -m fusedce_profiler.instrument.worker_child template PARENT SOCKET_FD`` is the worker template
instead (:mod:`fusedce_profiler.instrument.template`): it imports :data:`TEMPLATE_IMPORTS` and
forks a worker for each request; the worker runs :func:`serve` as a fresh one does."""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import traceback

from fusedce_profiler.instrument.lifetime import (adopt_orphans, die_with_parent, end_children, end_stranded_template,
                                                  end_worker)
from fusedce_profiler.instrument.reaper import start_reaper
from fusedce_profiler.instrument.strays import watch_strays
from fusedce_profiler.instrument.worker import JOBS
from fusedce_profiler.instrument.worker_log import JOB_HEADER


def _load(target: str):
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _serve(parent_pid: int, reply_fd: int, life_fd: int, preload: list[str], warm_up: list[str]) -> int:
    reaper = start_reaper(life_fd)
    adopt_orphans()
    watch_strays()  # what it adopts and nobody waits for holds no pid for long
    # SIGTERM: the parent's close() of a busy worker, or the parent's death (die_with_parent)
    signal.signal(signal.SIGTERM, lambda signum, frame: end_worker(spare=reaper))
    die_with_parent(parent_pid, spare=reaper)
    for kind in preload:
        _load(JOBS[kind])
    for target in warm_up:
        _load(target)()
    # What the imports made lives as long as the process: out of the cyclic collector's reach,
    # the collection each measurement settles with (a few hundred thousand objects once torch,
    # Triton and a back-end are loaded: 0.1-0.3 s each time) walks only what jobs make.
    gc.collect()
    gc.freeze()
    replies = os.fdopen(reply_fd, "wb")
    replies.write(b'{"ready": true}\n')
    replies.flush()
    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        print(f"{JOB_HEADER}{request['kind']} {json.dumps(request['payload'])}", flush=True)
        try:
            answer = {"ok": True, "reply": _load(JOBS[request["kind"]])(request["payload"])}
        except (Exception, KeyboardInterrupt):  # no terminal's Ctrl-C reaches a worker (its own session):
            text = traceback.format_exc()       # a KeyboardInterrupt here is the job's code raising it
            print(text, file=sys.stderr, flush=True)
            answer = {"ok": False, "error": text}
        answer["id"] = request.get("id")
        from fusedce_profiler.instrument.store import dumps

        replies.write((dumps(answer) + "\n").encode())
        replies.flush()
    end_stranded_template(wait=True)  # the job pipe closed: the command may be dying, its template stopped by a job
    end_children(spare=reaper)
    return 0


def serve(arguments: list[str]) -> int:
    """Serve jobs as the command line ``PARENT REPLY_FD LIFE_FD PRELOAD WARM_UP`` says."""
    return _serve(int(arguments[0]), int(arguments[1]), int(arguments[2]), [k for k in arguments[3].split(",") if k],
                  [t for t in arguments[4].split(",") if t])


TEMPLATE_IMPORTS = ("torch", *dict.fromkeys(t.partition(":")[0] for t in JOBS.values()))
"""What a worker template imports before it forks any worker: torch and the job kinds' modules, which
every worker imports (a warm-up's further imports stay each worker's own, as in a fresh one)."""


def _as_interpreter(arguments: list[str]) -> int:
    """:func:`serve` in a worker forked from the template, ending as an interpreter would: a
    ``SystemExit``'s code (its message and 1 for one that is not a number), a traceback and 1."""
    try:
        return serve(arguments)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # never back into the template's loop
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    if sys.argv[1] == "template":
        from fusedce_profiler.instrument.template_process import serve_template

        # returns in the template's forks
        forked = serve_template(int(sys.argv[3]), list(TEMPLATE_IMPORTS), int(sys.argv[2]))
        code = forked if isinstance(forked, int) else _as_interpreter(forked)
    else:
        code = serve(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (see the module docstring)
