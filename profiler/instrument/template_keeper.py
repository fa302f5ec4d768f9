"""The worker template's keeper: it sees that a stopped template does not outlive the command.

Stopped (``SIGSTOP`` from a job, a job's helper, or anyone), a worker template acts on nothing, its
parent's end included: it would stay stopped under init for good. A live worker of it sees to that
(:func:`~fusedce_profiler.instrument.lifetime.end_stranded_template`); with no worker left, the keeper
does. The template starts it before it imports anything, as a process of its own (its command line
names it, not a template); it watches the command and, once the command is gone, continues the
template (``SIGCONT``) for as long as it takes the template to end as it always does
(:mod:`~fusedce_profiler.instrument.template_process`: its workers, their daemons, its helpers — the
keeper among them), then kills a template still alive after :data:`GRACE_S` with its other children
(:func:`~fusedce_profiler.instrument.lifetime.end_template`). The kernel kills the
keeper when the template ends. A job that stops or kills the keeper too escapes it, as one that
disables every watcher of its worker does.

Public API: :func:`start_keeper`.
"""
from __future__ import annotations

import os
import sys
import time

from fusedce_profiler.instrument.lifetime import end_template, killed_with_parent
from fusedce_profiler.instrument.proctable import parent_of

GRACE_S = 10.0
"""How long a template may take to end once the command is gone (its own end waits 2 s for its workers)."""


def start_keeper(command: int) -> int:
    """In the template (pid ``os.getpid()``, the child of ``command``): start its keeper; its pid."""
    template = os.getpid()
    keeper = os.fork()
    if keeper != 0:
        return keeper
    try:
        killed_with_parent()
        os.closerange(3, 1 << 16)  # the template's socket: its end must come with the template's
        os.execv(sys.executable, [sys.executable, "-m", __name__, str(template), str(command)])
    finally:
        os._exit(1)


def keep(template: int, command: int) -> None:
    """Wait for ``command`` to be gone, then see ``template`` end (module docstring)."""
    while os.getppid() == template and parent_of(template) == command:
        time.sleep(0.5)
    if os.getppid() == template:
        end_template(template, GRACE_S)


if __name__ == "__main__":
    keep(int(sys.argv[1]), int(sys.argv[2]))
