"""A worker waits for the exited processes it adopted once they pile up, never for a job's own child."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers and /proc are Linux's")

PROBE = textwrap.dedent('''
    import os, select, subprocess, sys, time
    from fusedce_profiler.instrument import lifetime, strays

    def zombies_outside():
        return sum(strays._exited_outside(pid, os.getpgrp()) for pid in lifetime.children_of(os.getpid()))

    lifetime.adopt_orphans()
    if sys.argv[1] == "watched":
        strays.watch_strays()
    own = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"], start_new_session=True)
    time.sleep(1.5)  # exited, outside the group, and alone: its status stays the job's
    print("own", own.wait())
    same = os.fork()
    if same == 0:
        os._exit(7)
    # a daemon in its own session that forks and lets its parent exit, 3000 generations; the pipe
    # ends when the last one does
    alive, held = os.pipe()
    if os.fork() == 0:
        os.close(alive)
        os.setsid()
        for _ in range(3000):
            if os.fork():
                os._exit(0)
        os._exit(0)
    os.close(held)
    most, end = 0, time.monotonic() + 60
    while time.monotonic() < end and not select.select([alive], [], [], 0.05)[0]:
        most = max(most, zombies_outside())
    time.sleep(1.5)
    print("most", most)
    print("left", zombies_outside())
    print("same", os.waitstatus_to_exitcode(os.waitpid(same, 0)[1]))
    lifetime._reap()
''')


def _probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: int(line.split()[1]) for line in done.stdout.splitlines()}


def test_a_fork_loop_daemon_leaves_fewer_zombies_than_the_limit_and_a_jobs_own_children_keep_their_status():
    from fusedce_profiler.instrument.strays import MANY

    unwatched, watched = _probe("unwatched"), _probe("watched")
    assert unwatched["left"] >= 3000  # every generation a zombie of a subreaper that never waits
    assert watched["left"] < MANY and watched["most"] < 1500  # (near 400 on two idle cores)
    assert watched["own"] == 5 and watched["same"] == 7  # never taken from the job's own wait
