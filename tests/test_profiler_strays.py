"""A worker waits for the exited processes it adopted once they pile up, never for a job's own child."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers and /proc are Linux's")

PROBE = textwrap.dedent('''
    import ctypes, os, select, subprocess, sys, threading, time
    from fusedce_profiler.instrument import lifetime, strays

    def children():  # of every thread: the orphans go to the first living one
        found = []
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            try:
                with open(f"/proc/{os.getpid()}/task/{tid}/children") as fh:
                    found += [int(pid) for pid in fh.read().split()]
            except OSError:
                pass
        return found

    def zombies_outside():
        return sum(strays._stray(pid, os.getpgrp()) for pid in children())

    lifetime.adopt_orphans()
    if sys.argv[1] != "unwatched":
        strays.watch_strays()
    if sys.argv[1] == "main-thread-ended":  # as a back-end could: the job goes on in another thread
        threading.Thread(target=lambda: (exec(JOB, globals()), os._exit(0))).start()  # no shutdown without main
        ctypes.CDLL(None).pthread_exit(None)
    exec(JOB, globals())
''')

JOB = textwrap.dedent('''
    own = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"], start_new_session=True)
    time.sleep(1.5)  # exited, outside the group, and alone: its status stays the job's
    print("own", own.wait())
    same = os.fork()
    if same == 0:
        os._exit(7)
    # a program the job starts in a session of its own, exiting while the daemon's zombies pile up
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"],
                            start_new_session=True)
    kept = os.waitid, os.waitpid, strays.wait_for_strays, strays.MANY, strays._PERIOD_S
    if sys.argv[1] == "blinded":  # as a back-end could, once the watcher runs
        os.waitid, os.waitpid, strays.wait_for_strays = (lambda *a: None), (lambda *a: (0, 0)), (lambda *a: 0)
        strays.MANY, strays._PERIOD_S = 10**9, 3600.0
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
    os.waitid, os.waitpid, strays.wait_for_strays, strays.MANY, strays._PERIOD_S = kept
    print("late", late.wait())
    print("most", most)
    print("left", zombies_outside())
    print("same", os.waitstatus_to_exitcode(os.waitpid(same, 0)[1]))
    lifetime._reap()
''')


def _probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-u", "-c", f"JOB = {JOB!r}\n{PROBE}", mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: int(line.split()[1]) for line in done.stdout.splitlines()}


def test_a_fork_loop_daemon_leaves_fewer_zombies_than_the_limit_and_a_jobs_own_programs_keep_their_status():
    from fusedce_profiler.instrument.strays import MANY

    unwatched = _probe("unwatched")
    assert unwatched["left"] >= 3000  # every generation a zombie of a subreaper that never waits
    for mode in ("watched", "blinded", "main-thread-ended"):  # blinded: a job replaced what the watcher calls
        watched = _probe(mode)
        assert watched["left"] < MANY and watched["most"] < 1500, mode  # (near 400 on two idle cores)
        assert (watched["own"], watched["late"], watched["same"]) == (5, 3, 7), mode  # never a job's own
