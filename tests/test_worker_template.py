"""The worker template: workers forked from one pre-imported interpreter are the workers a fresh
start makes (their own session, streams, environment and mark; exit statuses as a ``Popen``'s), and
a worker whose start-time environment differs starts fresh."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fusedce_profiler.instrument import startup_hooks, template
from fusedce_profiler.instrument.lifetime import MARK_VARIABLE
from fusedce_profiler.instrument.worker import Worker, WorkerDied

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the template is Linux only")


@pytest.fixture(autouse=True)
def own_templates(monkeypatch):
    """This test's own templates (an earlier test of this process may have replaced or used up its
    own), closed at its end."""
    monkeypatch.setattr(template, "_TEMPLATES", {})
    monkeypatch.setattr(template, "_starts", 0)
    yield
    template.close_template()


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _live(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _environ(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return fh.read().split(b"\0")


def test_a_forked_worker_is_its_own_session_with_its_own_mark_and_no_descriptor_of_the_template(tmp_path):
    with Worker(tmp_path / "logs", preload=("environment",)) as first, Worker(tmp_path / "logs") as second:
        first.wait_ready()
        second.wait_ready()
        assert isinstance(second._process, template.ForkedProcess)
        forker = template.template_for(dict(os.environ))
        assert forker is not None and forker.owner == os.getpid() and len(template._TEMPLATES) == 1
        for worker in (first, second):
            state = _stat(worker.pid)
            assert int(state[1]) == forker.process.pid  # the template's child ...
            assert int(state[2]) == int(state[3]) == worker.pid  # ... in a session (and group) of its own
            assert f"{MARK_VARIABLE}={worker._mark}".encode() in _environ(worker.pid)  # found by kill_marked
            targets = [os.readlink(f"/proc/{worker.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{worker.pid}/fd")]
            assert not [t for t in targets if t.startswith("socket:")], targets
        assert first.call("environment", {}, 60)["python"]  # a job runs as in any worker
        assert int(_stat(forker.process.pid)[1]) == os.getpid()


def test_exit_statuses_come_through_the_template_as_a_popens(tmp_path):
    with Worker(tmp_path / "logs") as worker:
        worker.wait_ready()
        assert isinstance(worker._process, template.ForkedProcess)
        os.kill(worker.pid, signal.SIGSEGV)
        with pytest.raises(WorkerDied, match="killed by signal SIGSEGV"):
            worker.call("environment", {}, 60)
        assert worker._process.returncode == -signal.SIGSEGV


def test_a_worker_is_forked_only_from_a_template_of_its_start_time_environment(tmp_path):
    with Worker(tmp_path / "logs") as forked:
        forked.wait_ready()
        assert isinstance(forked._process, template.ForkedProcess)
        default = int(_stat(forked.pid)[1])
    env = dict(os.environ, FUSEDCE_TEST_ONLY_AT_CALL_TIME="1")  # read by a job, not at start: same template
    with Worker(tmp_path / "logs", env=env) as same:
        same.wait_ready()
        assert int(_stat(same.pid)[1]) == default
    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    with Worker(tmp_path / "logs", env=dict(os.environ, OMP_NUM_THREADS=threads)) as other, \
            Worker(tmp_path / "logs") as busy:
        other.wait_ready()  # read when OpenMP starts: another template
        busy.wait_ready()
        assert isinstance(other._process, template.ForkedProcess) and int(_stat(other.pid)[1]) != default
        assert len(template._TEMPLATES) == template.MAX_TEMPLATES
        with Worker(tmp_path / "logs", env=dict(os.environ, OMP_NUM_THREADS=threads + "0")) as third:
            third.wait_ready()  # a third set while both templates have a worker running: fresh
            assert isinstance(third._process, subprocess.Popen)
    with Worker(tmp_path / "logs", env=dict(os.environ, OMP_NUM_THREADS=threads + "0")) as replaced:
        replaced.wait_ready()  # their workers ended: an idle template gives way
        assert isinstance(replaced._process, template.ForkedProcess)
        assert len(template._TEMPLATES) == template.MAX_TEMPLATES
    with Worker(tmp_path / "logs", env=dict(os.environ, FUSEDCE_WORKER_TEMPLATE="0")) as switched_off:
        switched_off.wait_ready()
        assert isinstance(switched_off._process, subprocess.Popen)


def test_a_killed_template_is_replaced(tmp_path):
    with Worker(tmp_path / "logs") as first:
        first.wait_ready()
        killed = template.template_pids()
    os.kill(killed[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _live(killed[0]) and time.monotonic() < deadline:  # (a worker asked for meanwhile starts fresh)
        time.sleep(0.05)
    with Worker(tmp_path / "logs") as second:
        second.wait_ready()
        assert isinstance(second._process, template.ForkedProcess)
        assert template.template_pids() != killed and second.call("environment", {}, 60)["python"]


def test_a_worker_that_stops_its_template_is_closed_and_the_template_replaced(tmp_path):
    """A job that sends SIGSTOP to its parent stops the template, which then reaps no worker and sends
    no status: closing that worker waited for one and ended the command in a traceback."""
    with Worker(tmp_path / "logs") as first:
        first.wait_ready()
        stopped = template.template_pids()
        os.kill(stopped[0], signal.SIGSTOP)
    assert first._process.returncode is not None and not _live(stopped[0])
    with Worker(tmp_path / "logs") as second:
        assert isinstance(second._process, template.ForkedProcess) and template.template_pids() != stopped
        assert second.call("environment", {}, 60)["python"]


def test_the_variables_a_start_reads_are_told_by_name():
    env = {"PYTHONHASHSEED": "1", "PYTHONPATH": "x", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2",
           "TORCH_LOGS": "+dynamo", "CUDA_VISIBLE_DEVICES": "0", "FX_HANG_MARK": "m", "HOME": "/h"}
    assert template.import_time_variables(env) == {"PYTHONHASHSEED": "1", "OMP_NUM_THREADS": "2",
                                                  "TORCH_LOGS": "+dynamo", "CUDA_VISIBLE_DEVICES": "0"}


def _left_by_a_killed_parent(code: str, count: int, alive_for_s: float = 0.0) -> list[int]:
    """Run ``code`` (which prints ``count`` pids, then sleeps) in a process, ``kill -9`` it (``alive_for_s``
    after the pids came, every one of them still alive then), and return those still alive 30 s later."""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == count
        time.sleep(alive_for_s)
        assert all(_live(p) for p in pids)  # a live command ends its workers and templates itself
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_live(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _live(p)]


def test_the_template_ends_when_its_parent_does_kill_9_included(tmp_path):
    logs = f"Path({str(tmp_path)!r}) / 'logs'"
    code = ("import os, sys, time; from pathlib import Path; from fusedce_profiler.instrument.worker import Worker;"
            f"w = Worker({logs}); w.wait_ready(); v = Worker({logs});"
            "v.wait_ready(); from fusedce_profiler.instrument import template;"
            "print(*[t.process.pid for t in template._TEMPLATES.values()], w.pid, v.pid, flush=True); time.sleep(600)")
    assert _left_by_a_killed_parent(code, 3) == []


def test_the_template_ends_with_its_parent_while_a_fork_of_the_parent_holds_its_socket(tmp_path):
    """A fork of the parent (a data-loader worker, a test's own fork) keeps the parent's end of the
    socket open: the template, waiting for that end, outlived its parent by as long as the fork
    lived, and reaped nothing a parent could ask about."""
    logs = f"Path({str(tmp_path)!r}) / 'logs'"
    code = ("import os, time; from pathlib import Path; from fusedce_profiler.instrument.worker import Worker;"
            f"w = Worker({logs}); w.wait_ready(); from fusedce_profiler.instrument import template;"
            "fork = os.fork()\nif fork == 0:\n    time.sleep(60)\n    os._exit(0)\n"
            "print(template.template_pids()[0], w.pid, fork, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        held, worker, fork = [int(p) for p in parent.stdout.readline().split()]
    finally:
        parent.kill()
        parent.wait()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_live(held) or _live(worker)):
            time.sleep(0.1)
        assert not _live(held) and not _live(worker) and _live(fork)
    finally:
        os.kill(fork, signal.SIGKILL)


@pytest.mark.parametrize("stopped", ["template", "template, reaper killed", "worker, reaper killed"])
def test_a_template_or_worker_a_job_stopped_ends_when_its_parent_is_killed(tmp_path, stopped):
    """Stopped (``SIGSTOP`` from a job), the template notices neither its parent's end nor its
    socket's: a ``kill -9`` of the parent left it stopped for good. The worker's reaper ends it; with
    the reaper killed too, the worker's watchdog, which watches the command through the template
    (it watched only the stopped template, and both lived on). A stopped worker whose reaper was
    killed acts on nothing: the template, ending, ends it (it lived on, stopped, under init)."""
    logs = f"Path({str(tmp_path)!r}) / 'logs'"
    kill_reaper = "[os.kill(r, signal.SIGKILL) for r in proctable.children_of(w.pid)]; time.sleep(0.2);"
    stop = "os.kill(w.pid, signal.SIGSTOP);" if stopped.startswith("worker") else "os.kill(t, signal.SIGSTOP);"
    code = ("import os, signal, time; from pathlib import Path; from fusedce_profiler.instrument.worker import Worker;"
            f"w = Worker({logs}); w.wait_ready(); from fusedce_profiler.instrument import proctable, template;"
            + (kill_reaper if "reaper" in stopped else "") +
            f"t = template.template_pids()[0]; {stop} print(t, w.pid, flush=True); time.sleep(600)")
    assert _left_by_a_killed_parent(code, 2) == []


def test_a_template_a_job_stopped_ends_with_a_command_killed_long_after_its_job_pipe_closed(tmp_path):
    """The job pipe's end reaches the worker before the kernel hands a killed command's children on,
    by as long as the command takes to die (seconds under load). With its reaper killed and its
    template stopped, the worker is the only one left to end the template: one that gave up waiting
    for the command's end and exited left the template stopped under init for good."""
    logs = f"Path({str(tmp_path)!r}) / 'logs'"
    code = ("import os, signal, time; from pathlib import Path; from fusedce_profiler.instrument.worker import Worker;"
            f"w = Worker({logs}); w.wait_ready(); from fusedce_profiler.instrument import proctable, template;"
            "[os.kill(r, signal.SIGKILL) for r in proctable.children_of(w.pid)]; time.sleep(0.2);"
            "t = template.template_pids()[0]; os.kill(t, signal.SIGSTOP); w._process.stdin.close();"
            "print(t, w.pid, flush=True); time.sleep(600)")
    assert _left_by_a_killed_parent(code, 2, alive_for_s=4) == []  # longer than any fixed wait of the worker


def test_a_template_stopped_with_no_worker_left_ends_when_its_parent_is_killed(tmp_path):
    """Stopped by anyone once its last worker has closed (a job's helper made its child, a user's
    ``kill -STOP``), the template saw nothing of its parent's ``kill -9``, and no worker was left to see
    to it: it stayed stopped under init. Its keeper continues it once the command is gone; the keeper
    ends with it."""
    logs = f"Path({str(tmp_path)!r}) / 'logs'"
    code = ("import os, signal, time; from pathlib import Path; from fusedce_profiler.instrument.worker import Worker;"
            f"w = Worker({logs}); w.wait_ready(); w.close(); from fusedce_profiler.instrument import proctable, template;"
            "t = template.template_pids()[0]; os.kill(t, signal.SIGSTOP);"
            "k = [c for c in proctable.children_of(t) if b'template_keeper' in open(f'/proc/{c}/cmdline', 'rb').read()];"
            "print(t, *k, flush=True); time.sleep(600)")
    assert _left_by_a_killed_parent(code, 2) == []


def test_a_pythonpath_with_a_start_up_hook_starts_the_worker_fresh(tmp_path):
    """A ``sitecustomize.py`` runs when an interpreter starts: a template would have run it once,
    in itself, not in the worker."""
    (tmp_path / "sitecustomize.py").write_text("")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with Worker(tmp_path / "logs", env=env) as worker:
        worker.wait_ready()
        assert isinstance(worker._process, subprocess.Popen)


def test_an_environment_too_large_for_one_message_starts_the_worker_fresh_and_no_template(tmp_path):
    """A request holds the environment; one message on the template's socket must fit its send buffer
    (Linux's default refused 220,000 bytes with EMSGSIZE). Three 100 KB variables: the worker starts
    fresh, and no template is started for it (each would import torch and fail the same way)."""
    env = dict(os.environ, **{f"FUSEDCE_TEST_LARGE_{i}": "x" * 100_000 for i in range(3)})
    with Worker(tmp_path / "logs", env=env) as worker:
        worker.wait_ready()
        assert isinstance(worker._process, subprocess.Popen)
    assert template.template_pids() == [] and template._starts == 0


@pytest.mark.parametrize("forked", [True, False])
def test_a_worker_serves_though_the_current_folder_is_removed_as_it_starts(tmp_path, monkeypatch, forked):
    """A worker, forked or fresh, runs in the command's current folder (its back-ends' relative paths,
    torch's debug folder). That folder removed while a worker imports torch (a build folder cleaned beside
    the run) killed it at start-up — MKL's loader ("Cannot load libtorch_cpu.so") and torch's compiler
    (``os.getcwd``) read the current folder then: it is started once more, in the root folder, as every
    worker started after the removal is."""
    monkeypatch.setenv(template.SWITCH, "1" if forked else "0")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with Worker(tmp_path / "logs", preload=("cell",)) as worker:
        worker.wait_ready()
        assert os.readlink(f"/proc/{worker.pid}/cwd") == str(here)
    real_start = Worker.__init__

    def removed_as_it_starts(self, *args, **kwargs):
        real_start(self, *args, **kwargs)
        if here.exists():
            here.rmdir()

    monkeypatch.setattr(Worker, "__init__", removed_as_it_starts)
    for _ in range(2):  # the second started after the removal
        with Worker(tmp_path / "logs", preload=("cell",)) as worker:
            assert worker.call("environment")["torch"]
            folder = os.readlink(f"/proc/{worker.pid}/cwd")
    assert folder == os.sep
    assert json.loads(template._fork_request(["3", "4", "", ""], dict(os.environ)))["cwd"] == os.sep


def test_a_start_up_hook_of_the_python_installation_does_not_start_workers_fresh(tmp_path, monkeypatch):
    """A distribution's own ``sitecustomize`` (Debian's, in the standard library's folder) runs in every
    interpreter of that Python, the template's included: a worker whose path reaches it is forked (a GPU
    machine's Python has one: every worker started fresh there). A hook in any other folder of the
    path starts the worker fresh, even one this process ran itself: it runs once per interpreter."""
    import types

    hook = tmp_path / "sitecustomize.py"
    hook.write_text("")
    monkeypatch.setattr(startup_hooks, "interpreter_folders", lambda: {os.path.realpath(tmp_path)})
    assert startup_hooks.startup_hooks(f"{tmp_path}{os.pathsep}/nowhere") == []
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("")
    monkeypatch.setitem(sys.modules, "sitecustomize", types.SimpleNamespace(__file__=str(other / "sitecustomize.py")))
    assert startup_hooks.startup_hooks(f"{other}{os.pathsep}{tmp_path}") == [str(other / "sitecustomize.py")]


def test_a_start_up_hook_is_found_as_the_import_system_finds_it():
    """A package, and an empty entry (the current folder), as a fresh interpreter would import them."""
    package = Path(tempfile.mkdtemp()) / "pkg" / "sitecustomize"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert startup_hooks.startup_hooks(str(package.parent)) == [str(package / "__init__.py")]
    assert startup_hooks.startup_hooks(f"{os.pathsep}/nowhere") == []  # (the test's current folder has none)


def test_the_python_installations_folders_are_its_standard_library_and_site_packages():
    import sysconfig

    assert os.path.realpath(sysconfig.get_paths()["stdlib"]) in startup_hooks.interpreter_folders()
    assert os.path.realpath(sysconfig.get_paths()["purelib"]) in startup_hooks.interpreter_folders()


def test_threads_that_start_workers_at_once_each_get_their_own(tmp_path):
    """A grid over several devices starts a worker per device, each from a thread of its own: the
    template's socket carries one request and its answer at a time."""
    import threading

    replies, errors = [], []

    def start_two(index: int) -> None:
        try:
            for _ in range(2):
                with Worker(tmp_path / f"logs{index}") as worker:
                    replies.append((type(worker._process).__name__, bool(worker.call("environment", {}, 120))))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start_two, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors and replies == [("ForkedProcess", True)] * 6, (errors, replies)


def test_an_environment_variable_too_large_for_a_new_process_is_named(tmp_path):
    """One string over the 131,072 bytes ``exec`` takes: the worker cannot start, and the line names
    the variable (a request this large is never sent to a template: the worker starts fresh)."""
    from fusedce_profiler.instrument.worker import WorkerNotStarted

    with pytest.raises(WorkerNotStarted) as refused:
        Worker(tmp_path / "logs", env={**os.environ, "HUGE_SETTING": "x" * 200_000})
    assert refused.value.at_start
    assert refused.value.summary == (
        "the worker (python -m fusedce_profiler.instrument.worker_child) could not be started: the environment "
        "variable 'HUGE_SETTING' holds 200,014 bytes, over the 131,072 a new process takes in one string: shorten "
        "or unset it")


def test_a_worker_the_system_has_no_descriptor_for_is_one_line_naming_the_limit(tmp_path, monkeypatch):
    import errno
    import resource

    from fusedce_profiler.instrument.worker import WorkerNotStarted

    def no_descriptor():
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "pipe", no_descriptor)
    with pytest.raises(WorkerNotStarted) as refused:
        Worker(tmp_path / "logs")
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert refused.value.summary.endswith(
        f"could not be started: too many open files (this process's open-files limit, `ulimit -n`, is {limit}: "
        "raise it)")
    assert set(os.listdir("/proc/self/fd")) == before  # the log's descriptor closed again


def test_a_python_callers_run_that_cannot_start_a_worker_raises_run_stopped_and_prints_nothing(
        tmp_path, monkeypatch, capsys):
    from fusedce_profile import run_grid
    from fusedce_profile.errors import RunStopped

    monkeypatch.setenv("HUGE_SETTING", "x" * 200_000)
    with pytest.raises(RunStopped) as stopped:
        run_grid(out=tmp_path / "run", device="cpu", hidden=[8], vocab=[64], tokens=[8], mode=["fp32"], repeats=1,
                 warmup=0, backend=["torch"])
    assert "variable 'HUGE_SETTING' holds 200,014 bytes" in str(stopped.value)
    assert str(stopped.value).endswith("the run stopped after 0 of 1 new cell") and stopped.value.records == []
    assert capsys.readouterr() == ("", "")


def test_a_run_stopped_by_a_worker_that_cannot_start_exits_3_though_its_report_cannot_be_written(tmp_path, monkeypatch):
    """``grid --resume`` under ``ulimit -n 10``: the worker cannot be made, then the report meets the same
    limit. Both lines are said; the exit code is the run's (3), not the report's (2)."""
    import errno
    from pathlib import Path as _Path

    from typer.testing import CliRunner

    from fusedce_cli.app import app
    from fusedce_profiler.instrument.worker import WorkerNotStarted

    grid = ["grid", "--device", "cpu", "--hidden", "8", "--vocab", "64", "--mode", "fp32", "--repeats", "1",
            "--warmup", "0", "--tokens", "8,16", "--backend", "torch", "--out", str(tmp_path / "run")]
    assert CliRunner().invoke(app, grid).exit_code == 0
    results = tmp_path / "run" / "results.jsonl"
    results.write_text(results.read_text().splitlines()[0] + "\n")  # one cell left to measure

    def no_descriptor(*args, **kwargs):
        raise WorkerNotStarted(OSError(errno.EMFILE, os.strerror(errno.EMFILE)), _Path("logs/w.log"), {})

    def no_report(*args, **kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), "/site-packages/pandas/io/formats/csvs.py")

    monkeypatch.setattr("fusedce_profile.grid_run.run_grid", no_descriptor)
    monkeypatch.setattr("fusedce_profile.grid_run.build_report", no_report)
    result = CliRunner().invoke(app, [*grid, "--resume"])
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert "could not be started: too many open files" in said and "writes the report once that is mended" in said
    assert "csvs.py" not in said
