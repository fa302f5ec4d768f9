"""profiler/worker.py: a worker that dies at start-up is told apart from a job that fails."""
import os
import textwrap

import pytest

from processes import workers_of
from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied


def _worker_dying_at_start(tmp_path, monkeypatch, *stderr_lines: str) -> tuple[Worker, WorkerDied]:
    """A worker whose child prints ``stderr_lines`` and exits with code 1 before it is ready."""
    said = "\n".join(stderr_lines)
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import os, sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:
            print({said!r}, file=sys.stderr, flush=True)
            os._exit(1)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    worker = Worker(tmp_path / "logs")
    with pytest.raises(WorkerDied) as died:
        worker.call("environment", timeout_s=60)
    return worker, died.value


def test_a_worker_that_dies_before_it_is_ready_is_at_start(tmp_path, monkeypatch):
    worker, died = _worker_dying_at_start(tmp_path, monkeypatch, "ImportError: cannot import name 'x' from 'torch'")
    assert died.at_start and not died.timed_out
    assert died.summary.startswith("the worker (python -m fusedce_profiler.instrument.worker_child) died at start-up: exited with code 1")
    assert "(ImportError: cannot import name 'x' from 'torch')" in died.summary
    assert f"; log {worker.log_path}" in died.summary
    assert workers_of(os.getpid(), wait_s=5) == []


def test_a_leak_report_printed_at_exit_is_not_named_as_the_cause(tmp_path, monkeypatch):
    """A compiled extension may print its leak report as the interpreter exits, after the line
    that says why: that report is never the worker's last words."""
    _, died = _worker_dying_at_start(
        tmp_path, monkeypatch, "SystemExit: the real cause", "nanobind: leaked 2 functions!",
        ' - leaked function "dump"', " - ... skipped remainder",
        "nanobind: this is likely caused by a reference counting issue in the binding code.",
        "See https://nanobind.readthedocs.io/en/latest/refleaks.html")
    assert "(SystemExit: the real cause)" in died.summary
    assert "nanobind" not in died.summary


def test_a_job_that_raises_is_job_failed_with_the_exception_in_its_first_line(tmp_path):
    with Worker(tmp_path / "logs") as worker:
        with pytest.raises(JobFailed) as failed:
            worker.call("cell", {"spec": {"backend": "torch"}})  # an invalid spec
        first = str(failed.value).splitlines()[0]
        assert first.startswith("job cell failed in the worker (ValueError: spec.tokens must be an integer")
        assert f"log {worker.log_path}" in first
        assert worker.call("environment", timeout_s=120)["torch"]  # the worker lives on
    assert workers_of(os.getpid(), wait_s=5) == []


def test_a_reply_its_reader_refuses_is_the_workers_death_and_ends_that_worker(tmp_path):
    def read(raw):
        raise KeyError("torch")

    with Worker(tmp_path / "logs") as worker:
        with pytest.raises(WorkerDied) as died:
            worker.call("environment", timeout_s=120, read=read)
        assert died.value.reason.startswith("the worker's reply to the environment job did not have its shape ('torch'")
        assert workers_of(os.getpid(), wait_s=5) == []  # nothing more that channel carries is trusted


def test_the_worker_starts_without_a_warning_in_its_log(tmp_path):
    """Importing the ``profiler`` package must not import the worker module before
    ``python -m fusedce_profiler.instrument.worker_child`` runs it (runpy warns in every worker's log otherwise)."""
    with Worker(tmp_path / "logs") as worker:
        worker.call("environment", timeout_s=120)
        log = worker.log_path
    assert "Warning" not in log.read_text()


@pytest.mark.faults
def test_a_finished_workers_log_names_no_path_or_host_of_the_machine(tmp_path, monkeypatch):
    """What the child printed (a traceback names the Python installation, the home and current
    folders, the run folder) is kept, with those paths and the host name as placeholders."""
    import socket
    import sys

    run = tmp_path / "run"
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import os, socket, sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:
            print("python", sys.prefix + "/lib/x.py", "home", os.path.expanduser("~") + "/.cache",
                  "cwd", os.getcwd() + "/train.py", "run", {str(run)!r} + "/snapshots", "host",
                  socket.gethostname(), file=sys.stderr, flush=True)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with Worker(run / "logs") as worker:
        worker.call("environment", timeout_s=120)
    log = worker.log_path.read_text()
    assert "python ‹python›/lib/x.py home ~/.cache cwd ‹cwd›/train.py run ‹run folder›/snapshots" in log
    for name in (sys.prefix, str(run), os.getcwd()):
        assert name not in log, name
    if len(socket.gethostname()) >= 4:
        assert "host ‹host›" in log and socket.gethostname() not in log


@pytest.mark.faults
def test_a_worker_that_prints_without_end_leaves_a_log_of_its_start_and_end(tmp_path, monkeypatch):
    """Output beyond the kept start and end is cut when the worker ends (a back-end printing 200 MB
    left a 200 MB log in the folder meant for a bug report, read whole into memory to be scrubbed)."""
    from fusedce_profiler.instrument import scrub

    monkeypatch.setattr(scrub, "LOG_HEAD_BYTES", 4000)
    monkeypatch.setattr(scrub, "LOG_TAIL_BYTES", 4000)
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent('''
        import sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:
            print("FIRST LINE", file=sys.stderr)
            for i in range(20000):
                print(f"chatter {i:05d}", file=sys.stderr)
            print("LAST LINE", file=sys.stderr, flush=True)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with Worker(tmp_path / "run" / "logs") as worker:
        worker.call("environment", timeout_s=120)
    log = worker.log_path.read_text()
    assert log.startswith("FIRST LINE") and "LAST LINE" in log and "chatter 00000" in log
    assert "bytes of output cut: the log keeps its first and last lines" in log
    assert len(log) < 9000 and "chatter 10000" not in log


def test_a_failed_jobs_summary_names_its_log_within_the_run_folder(tmp_path):
    """A job that raised was stored with its log named relative to the current folder."""
    failed = JobFailed("training-step", "Traceback …\nValueError: bad name", tmp_path / "run" / "logs" / "w.log")
    assert failed.summary_in(tmp_path / "run") == \
        "job training-step failed in the worker (ValueError: bad name); log logs/w.log"
    assert str(failed).splitlines()[0] == failed.summary_in() + ":"
    assert failed.cause == "ValueError: bad name"  # what a check names: its worker's log goes with it


def test_killing_a_workers_tree_kills_each_process_group_found_whole(tmp_path):
    """A daemon's process group is killed whole, not only the pids a walk of the tree found: a
    member forked after the walk (a daemon that forks and lets its parent exit, over and over)
    outran a kill by pid. The walk here sees the group's leader only."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent('''
        import os, time
        from fusedce_profiler.instrument import lifetime, proctable
        read, write = os.pipe()
        leader = os.fork()
        if leader == 0:
            os.setsid()
            member = os.fork()
            if member == 0:
                time.sleep(60)
                os._exit(0)
            os.write(write, str(member).encode())
            time.sleep(60)
            os._exit(0)
        member = int(os.read(read, 32))
        lifetime.descendants = lambda root, skip=(): [leader] if proctable.process_state(leader) != "Z" else []
        lifetime.kill_tree(os.getpid(), spare=-1)
        time.sleep(0.2)
        print(proctable.process_state(member) in ("", "Z"))
        if proctable.process_state(member) not in ("", "Z"):
            os.kill(member, 9)
    ''')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_a_group_seen_empty_is_never_signalled_again(tmp_path):
    """The kernel frees a process group's id with its last member, and a fork loop can wrap the pids
    round within a chase: a remembered id of an emptied group could name a stranger's group by the
    final kill. Once a walk finds it empty, it is signalled no more."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent('''
        import os, signal, time
        from fusedce_profiler.instrument import lifetime, proctable
        leader = os.fork()
        if leader == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        while proctable.group_of(leader) != leader:
            time.sleep(0.01)
        walks, sent, killpg = [], [], os.killpg
        def find():
            walks.append(None)
            if len(walks) == 1:
                return [leader]
            if len(walks) == 2:  # the group empties: its id is free for anyone from here
                os.kill(leader, signal.SIGKILL)
                os.waitpid(leader, 0)
            return []
        def logged(group, sig):
            if sig:
                sent.append((len(walks), group, sig))
            return killpg(group, sig)
        os.killpg = logged
        lifetime._stop_then_kill(find, quiet_walks=3, walks=10, grouped=lambda pid: True)
        print([walk for walk, group, sig in sent if group == leader])
    ''')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[1]", done.stderr  # stopped once, at the walk that found it; never killed by id


def test_the_commands_search_of_the_marks_kills_at_once_and_never_stops(tmp_path):
    """The command searches the marks itself (closing a worker that died): a ``kill -9`` of it in the
    middle of a stop-then-kill would leave what it had stopped stopped for good, parent 1. Each
    process found is killed at once."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent('''
        import os, signal, subprocess, sys, time
        from fusedce_profiler.instrument import lifetime, proctable
        env = {**os.environ, lifetime.MARK_VARIABLE: "probe-%d" % os.getpid()}
        daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                                  start_new_session=True)
        time.sleep(0.3)
        sent, kill = [], os.kill
        def logged(pid, sig):
            sent.append(sig)
            return kill(pid, sig)
        os.kill = logged
        lifetime.kill_marked(env[lifetime.MARK_VARIABLE])
        print(daemon.wait(timeout=10), signal.SIGSTOP in sent)
    ''')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["-9", "False"], (done.stdout, done.stderr)


def test_the_mark_search_spares_a_process_older_than_the_worker_or_of_another_user(tmp_path):
    """A job's code can hand its worker's mark to any process: one that started before the worker
    never was under it, and (run as root) another user's is not the run's. Both are spared; a
    process of this user started since is killed."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent('''
        import os, subprocess, sys, time
        from fusedce_profiler.instrument import lifetime, proctable
        env = {**os.environ, lifetime.MARK_VARIABLE: "probe-%d" % os.getpid()}
        def sleep(**kwargs):
            return subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
        older = sleep(env=env, start_new_session=True)
        time.sleep(0.05)
        worker = sleep()  # stands for the worker: its start is the search's bound
        time.sleep(0.05)
        newer = sleep(env=env, start_new_session=True)
        stranger = sleep(env=env, start_new_session=True, user=65534) if os.getuid() == 0 else None
        time.sleep(0.3)
        lifetime.kill_marked(env[lifetime.MARK_VARIABLE], since=proctable.started(worker.pid))
        time.sleep(0.2)
        print(older.poll(), newer.wait(timeout=10), stranger.poll() if stranger else None)
        for process in (older, worker, stranger):
            if process is not None:
                process.kill()
    ''')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["None", "-9", "None"], (done.stdout, done.stderr)


def test_a_worker_that_died_silently_on_a_full_disk_is_an_os_error_naming_its_log(tmp_path, monkeypatch):
    """On a full disk the worker could not write its log and died without a word: the job (a user's loss
    under ``doctor``) was blamed, "the worker exited with code 1", and the named log was empty."""
    import errno
    import signal

    from fusedce_profiler.instrument import worker as worker_module

    monkeypatch.setattr(worker_module, "disk_full", lambda folder: True)
    worker = Worker(tmp_path / "logs")
    try:
        worker.wait_ready()
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(OSError) as raised:
            worker.call("environment", timeout_s=60)
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(worker.log_path)
    finally:
        worker.close()


def test_a_job_that_ends_its_worker_silently_on_a_nearly_full_disk_is_the_jobs_failure(tmp_path, monkeypatch):
    """The job's header reached the log, so the log could be written: a job that ends its worker
    without a word (a loss calling ``os._exit(1)``) is that job's failure, exit code and all, even
    where little space is left — never "No space left on device" naming a log that was written."""
    from fusedce_profiler.instrument import worker as worker_module

    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent('''
        import os, sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:
            import fusedce_profiler.instrument.environment as environment
            environment.environment_job = lambda payload: os._exit(1)
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(worker_module, "disk_full", lambda folder: True)
    worker = Worker(tmp_path / "logs")
    try:
        with pytest.raises(WorkerDied) as died:
            worker.call("environment", timeout_s=60)
        assert died.value.reason == "the worker exited with code 1" and not died.value.at_start
        assert worker.log_path.read_text().startswith("--- job environment")
    finally:
        worker.close()
    assert workers_of(os.getpid(), wait_s=5) == []
