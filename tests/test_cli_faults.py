"""Faults during a run, injected for real: every one gets one clear answer and loses nothing.

A hung back-end, SIGTERM/SIGINT/SIGKILL to the CLI, two runs into one folder, NaN losses, a
worker that cannot start, a back-end that raises in every cell, a file-size limit, damaged
result lines. CLI subprocesses run in their own process group with bounded waits, and each
test that starts one checks at the end that no worker outlived it (``processes.workers_of``).
"""
from __future__ import annotations

import contextlib
import html
import json
import os
import resource
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from processes import cli_env, kill_group, run_cli, start_cli, wait_for, workers_of
from fusedce_profiler.instrument.store import LOCK_FILE, PLAN_FILE, RESULTS_FILE

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

BACKENDS = textwrap.dedent('''
    import os, time
    import torch.nn.functional as F

    def ok(hidden, weight, target, bias=None):
        return F.cross_entropy(F.linear(hidden, weight, bias), target)

    def nan(hidden, weight, target, bias=None):
        return ok(hidden, weight, target, bias) * float("nan")

    def nan_grad(hidden, weight, target, bias=None):  # a finite loss whose gradients are not
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: grad * float("inf"))
        return ok(hidden, weight, target, bias)

    def boom(hidden, weight, target, bias=None):
        raise RuntimeError("boom")

    def clone_parent(hidden, weight, target, bias=None):  # a helper made its template's child, pid in $FX_HELPER
        import ctypes, signal
        if not os.path.exists(os.environ["FX_HELPER"]):  # clone(CLONE_PARENT | SIGCHLD), x86-64's number
            worker, parent = os.getpid(), os.getppid()
            pid = ctypes.CDLL(None, use_errno=True).syscall(56, 0x00008000 | signal.SIGCHLD, 0, 0, 0, 0)
            if pid == 0:
                try:
                    os.setsid()
                    if os.environ.get("FX_HELPER_STOPS") == "loop":  # stops and continues the worker's parent
                        toggle = f"kill -STOP {parent} 2>/dev/null; sleep 0.01; kill -CONT {parent} 2>/dev/null"
                        os.execve("/bin/sh", ["sh", "-c", f"while :; do {toggle}; done"], {})
                    if os.environ.get("FX_HELPER_STOPS"):  # stops the worker's parent as the worker exits
                        state = f"s=$(cut -d' ' -f3 /proc/{worker}/stat 2>/dev/null)"
                        gone = f"while {state} && [ $s != Z ]; do sleep 0.01; done"
                        os.execve("/bin/sh", ["sh", "-c", f"{gone}; kill -STOP {parent}; exec sleep 300"], {})
                    os.execve("/bin/sleep", ["sleep", "300"], {})  # no mark, a session of its own
                finally:
                    os._exit(0)
            with open(os.environ["FX_HELPER"] + ".parent", "w") as fh:
                fh.write(str(parent))
            with open(os.environ["FX_HELPER"], "w") as fh:
                fh.write(str(pid))
        return ok(hidden, weight, target, bias)

    def clone_parent_hang(hidden, weight, target, bias=None):  # clone_parent's helper, then a cell that never ends
        clone_parent(hidden, weight, target, bias)
        while True:
            time.sleep(1)

    def die(hidden, weight, target, bias=None):  # its worker ends in the cell, noted in $FX_DIED
        open(os.environ["FX_DIED"], "w").close()
        os._exit(9)

    def escapes(hidden, weight, target, bias=None):  # a title, a cleared screen, red, a C1 sequence
        raise RuntimeError("\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b0m | pipe")

    def spawn(hidden, weight, target, bias=None):  # a helper process in its group, a daemon outside it
        import signal, subprocess, sys
        if os.environ.get("FX_KILL_REAPER"):  # first the worker's reaper: the worker's other child
            for task in os.listdir("/proc/self/task"):
                for pid in open(f"/proc/self/task/{task}/children").read().split():
                    os.kill(int(pid), signal.SIGKILL)
        if os.environ.get("FX_STOP_TEMPLATE") and b"template" in open(f"/proc/{os.getppid()}/cmdline", "rb").read():
            os.kill(os.getppid(), signal.SIGSTOP)  # then stops its worker's template (a forked worker's parent)
        if os.environ.get("FX_BLIND"):  # then deaf to the death signal, and the parent it asks for is forged
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            parent = os.getppid()
            os.getppid = lambda: parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        read, write = os.pipe()
        if os.fork() == 0:  # fork, setsid, fork: the daemon's parent exits at once
            os.setsid()
            if os.fork() == 0:
                os.write(write, str(os.getpid()).encode())
                time.sleep(300)
            os._exit(0)
        daemon = os.read(read, 32).decode()
        with open(os.environ["FX_CHILD_PID"] + ".tmp", "w") as fh:
            fh.write(f"{child.pid} {daemon}")
        os.rename(os.environ["FX_CHILD_PID"] + ".tmp", os.environ["FX_CHILD_PID"])
        while True:
            time.sleep(1)

    def daemon(hidden, weight, target, bias=None):  # starts a daemon (fork, setsid, fork) once, then trains
        path = os.environ["FX_DAEMON_PID"]
        if not os.path.exists(path) and os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open(path + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.rename(path + ".tmp", path)
                time.sleep(300)
            os._exit(0)
        while not os.path.exists(path):
            time.sleep(0.05)
        if os.environ.get("FX_DAEMON_EXIT"):  # then ends its own worker, as a crashing extension would
            os._exit(0)
        return ok(hidden, weight, target, bias)

    def alters(hidden, weight, target, bias=None):  # alters its worker (the cell job, stdin), then trains
        import fusedce_profiler.grid.cell as cell
        cell.run_cell_job = lambda payload: {"status": "ok", "peak_step_bytes": 7}
        try:
            os.close(0)
        except OSError:  # closed at the back-end's first call
            pass
        return ok(hidden, weight, target, bias)

    # forks and exits at every generation (with FX_HOPPER_SETSID also a new session: no group to
    # kill), for 60 s at most; every 100th generation touches its heartbeat file
    HOP = ("import os, time\\nbeat, n, end = {beat!r}, 0, time.time() + 60\\nwhile time.time() < end:\\n"
           "    if os.fork():\\n        os._exit(0)\\n" + ("    os.setsid()\\n" if os.environ.get("FX_HOPPER_SETSID") else "")
           + "    n += 1\\n    if n % 100 == 0:\\n        os.utime(beat)\\n")

    def hopper(hidden, weight, target, bias=None):  # a daemon that keeps changing its pid, then a hang
        import sys
        if os.fork() == 0:
            os.setsid()
            with open(os.environ["FX_HOPPER_GROUP"] + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            beat = os.environ["FX_HOPPER_GROUP"] + ".beat"
            open(beat, "w").close()
            os.rename(os.environ["FX_HOPPER_GROUP"] + ".tmp", os.environ["FX_HOPPER_GROUP"])
            os.execvp(sys.executable, [sys.executable, "-S", "-c", HOP.format(beat=beat)])
        while True:
            time.sleep(1)

    def hang(hidden, weight, target, bias=None):
        print("home", os.path.expanduser("~"), "cwd", os.getcwd(), flush=True)  # the machine's names, in its log
        if os.environ.get("FX_LOCK_LOG"):  # the log is this process's standard output: lock it
            import fcntl
            fcntl.flock(1, fcntl.LOCK_EX)
        mark = os.environ.get("FX_HANG_MARK")
        if os.environ.get("FX_HANG_STOPPED") or os.environ.get("FX_HANG_DEAF"):  # its reaper killed, then
            import ctypes, signal, threading
            for task in os.listdir("/proc/self/task"):
                for pid in open(f"/proc/self/task/{task}/children").read().split():
                    os.kill(int(pid), signal.SIGKILL)
            if os.environ.get("FX_HANG_DEAF"):  # deaf to SIGTERM, and the watchdog thread ended
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                for thread in threading.enumerate():
                    if thread.name == "parent-watchdog":
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                                   ctypes.py_object(SystemExit))
            if mark:
                open(mark, "w").close()
            if os.environ.get("FX_HANG_STOPPED"):  # itself stopped: it acts on nothing
                os.kill(os.getpid(), signal.SIGSTOP)
        if mark:
            open(mark, "w").close()
        while True:
            time.sleep(1)
''')

TINY = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--repeats", "1", "--warmup", "0"]


@pytest.fixture
def fx(tmp_path, monkeypatch):
    """A folder holding the test back-ends (module ``fx_backends``), on this process's path too."""
    folder = tmp_path / "backends"
    folder.mkdir()
    (folder / "fx_backends.py").write_text(BACKENDS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _plain(text: str) -> str:
    return " ".join(text.split())


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines() if line.strip()]


# --- 1. a hung back-end is a timeout, and the run goes on -------------------------------------

CELL_TIMEOUT_S = 2
"""Long enough for a tiny cell on a loaded CI machine (it takes about 20 ms): a fresh worker's imports
and the CPU meter's set-up come before its clock starts. The hung cell waits it out in full."""


def test_a_hanging_backend_is_recorded_as_timeout_and_the_run_goes_on(fx, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--tokens", "16", "--backend", "torch", "--backend", "fx_backends:hang",
                                      "--backend", "fusedce", "--cell-timeout", str(CELL_TIMEOUT_S), "--out", str(out),
                                      "--json"])
    rows = {r["spec"]["backend"]: r for r in _rows(out)}
    assert rows["fx_backends:hang"]["status"] == "timeout"
    assert f"timed out after {CELL_TIMEOUT_S} s" in rows["fx_backends:hang"]["message"]
    assert rows["fusedce"]["status"] == "ok", rows["fusedce"]["message"]  # after the timeout, on a fresh worker
    assert "| fx_backends:hang | 16 |" in (out / "summary.md").read_text()
    assert f"timeout: timed out after {CELL_TIMEOUT_S} s" in (out / "summary.md").read_text()
    summary = json.loads(result.stdout)
    assert summary["cells"]["timeout"] == 1
    assert "; log logs/worker-" in rows["fx_backends:hang"]["message"]  # a folder stores no absolute path
    assert str(tmp_path) not in (out / RESULTS_FILE).read_text() + (out / "summary.md").read_text()
    assert result.exit_code == 1  # the named back-end failed in every cell
    assert workers_of(os.getpid(), wait_s=10) == []


def test_cell_timeout_defaults_per_device_and_zero_means_none():
    from fusedce_profile.defaults import resolve_cell_timeout

    assert resolve_cell_timeout(None, "cuda:1") == 900 and resolve_cell_timeout(None, "cpu") == 600
    assert resolve_cell_timeout(0, "cpu") is None and resolve_cell_timeout(5, "cpu") == 5


def test_cell_timeout_is_an_option_of_the_default_command_and_grid():
    for args in (["--help"], ["grid", "--help"]):
        assert "--cell-timeout SECONDS" in CliRunner().invoke(app, args).stdout


# --- 2, 3, 16. signals, the lock, the report of a cut run -------------------------------------

def _start_hung_run(fx: Path, tmp_path: Path, out: Path):
    mark = tmp_path / "hung"
    env = cli_env(fx, FX_HANG_MARK=str(mark))
    process = start_cli([*TINY, "--tokens", "16", "--backend", "torch", "--backend", "fx_backends:hang",
                         "--backend", "fusedce", "--out", str(out), "--json"], env)
    wait_for(mark.exists, 120, "the hung cell to start", process)
    return process, env


def test_a_signal_to_the_cli_writes_a_partial_report_and_leaves_no_worker(fx, tmp_path):
    """SIGTERM (exit 143) and Ctrl-C (exit 130), each to a run of its own; the two runs go side by side."""
    runs = {}
    try:
        for signum, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            out = tmp_path / signum.name / "run"
            out.parent.mkdir()
            runs[signum] = (code, out, start_cli([*TINY, "--tokens", "16", "--backend", "torch", "--backend",
                                                  "fx_backends:hang", "--backend", "fusedce", "--out", str(out),
                                                  "--json"], cli_env(fx, FX_HANG_MARK=str(out.parent / "hung"))))
        for signum, (code, out, process) in runs.items():
            wait_for((out.parent / "hung").exists, 120, "the hung cell to start", process)
            assert workers_of(process.pid), "the hung cell's worker should be running"
            os.killpg(process.pid, signum)  # the whole group, as a terminal or a CI runner does
        said = {signum: process.communicate(timeout=120) for signum, (_, _, process) in runs.items()}
    finally:
        for _, _, process in runs.values():
            kill_group(process)
    for signum, (code, out, process) in runs.items():
        stdout, stderr = said[signum]
        assert process.returncode == code, stderr
        assert "Interrupted after 1 of 3 new cells; continue with the same command and --resume --out" in _plain(stderr)
        assert workers_of(process.pid, wait_s=10) == []
        note = "1 of 3 cells — interrupted; continue with the same command and `--resume --out {}`"
        stored = note.format("‹run folder›")  # a stored file names no path of the machine
        assert stored in (out / "summary.md").read_text().replace("\\`", "`")  # Markdown-escaped
        assert html.escape(stored, quote=False) in (out / "report.html").read_text()
        summary = json.loads(stdout)
        assert note.format(out.resolve()) in summary["notes"] and summary["exit_code"] == code
        assert len(json.loads((out / PLAN_FILE).read_text())["cells"]) == 3


def test_a_second_run_into_a_held_folder_says_who_holds_it_and_changes_nothing(fx, tmp_path):
    out = tmp_path / "run"
    process, _ = _start_hung_run(fx, tmp_path, out)
    try:
        before = (out / RESULTS_FILE).read_text()
        for command in ([*TINY, "--tokens", "16", "--backend", "torch", "--resume"],
                        [*TINY, "--tokens", "16", "--backend", "torch", "--force"],
                        ["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8", "--force"],
                        ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--force"]):
            held = CliRunner().invoke(app, [*command, "--out", str(out)])
            assert held.exit_code == 2 and f"is in use by pid {process.pid}" in _plain(held.stderr), held.output
            assert held.exception is None or isinstance(held.exception, SystemExit)
        assert (out / RESULTS_FILE).read_text() == before  # --force removed nothing of the running run
    finally:
        kill_group(process)
    assert workers_of(process.pid, wait_s=10) == []


def test_kill_9_of_the_cli_takes_its_worker_with_it(fx, tmp_path):
    process, _ = _start_hung_run(fx, tmp_path, tmp_path / "run")
    try:
        assert workers_of(process.pid)
        os.kill(process.pid, signal.SIGKILL)  # the CLI alone: its worker is in a session of its own
        process.wait(timeout=30)
        assert workers_of(process.pid, wait_s=15) == [], "the worker outlived the killed CLI"
    finally:
        kill_group(process)


@pytest.mark.parametrize("locked", [False, True, "stopped", "deaf"],
                         ids=["log as it is", "log locked by the back-end", "reaper killed, worker stopped",
                              "reaper killed, SIGTERM ignored, watchdog ended"])
def test_kill_9_of_the_cli_leaves_a_worker_log_that_names_no_machine_path(fx, tmp_path, locked):
    """The command scrubs a worker's log as it closes the worker; killed, it never did: the log kept
    the home and current folders. The worker and its reaper scrub it once the worker's tree is gone,
    a lock the back-end took on its own standard output (the log) notwithstanding. A worker stopped
    with its reaper killed is woken by the template and ends as always; one that is deaf to that as
    well is killed by the template, which scrubs its log."""
    home, cwd, out = tmp_path / "home", tmp_path / "cwd", tmp_path / "run"
    home.mkdir(), cwd.mkdir()
    mark = tmp_path / "hung"
    process = start_cli([*TINY, "--tokens", "16", "--backend", "fx_backends:hang", "--out", str(out)],
                        cli_env(fx, FX_HANG_MARK=str(mark), HOME=str(home),
                                **({"FX_LOCK_LOG": "1"} if locked is True else {}),
                                **({"FX_HANG_STOPPED": "1"} if locked == "stopped" else {}),
                                **({"FX_HANG_DEAF": "1"} if locked == "deaf" else {})),
                        cwd=cwd)
    try:
        wait_for(mark.exists, 120, "the hung cell to start", process)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        assert workers_of(process.pid, wait_s=15) == []

        def scrubbed() -> bool:
            text = "".join(log.read_text(errors="replace") for log in (out / "logs").iterdir())
            return "home ~ cwd ‹cwd›" in text and str(home) not in text and str(cwd) not in text

        wait_for(scrubbed, 15, "the killed run's worker log to be scrubbed")
    finally:
        kill_group(process)


@pytest.mark.slow
@pytest.mark.parametrize("reaper", ["alive", "killed by the back-end", "killed, SIGTERM ignored, getppid forged",
                                    "killed, the template stopped"])
def test_kill_9_of_the_cli_takes_the_processes_a_backend_started_with_it(fx, tmp_path, reaper):
    """``kill -9`` of the command alone, as the OOM killer does, while a back-end waits after starting
    a helper in the worker's group and a daemon in a session of its own: both end with the command,
    also when the back-end first killed the worker's reaper, and when it also ignores the death
    signal and replaces ``os.getppid`` (the watchdog's own poll ends them), and when it also stopped
    the worker's template (the watchdog watches the command through it)."""
    from processes import _alive

    child_pid = tmp_path / "child.pid"
    hostile = {"FX_KILL_REAPER": "1"} if reaper != "alive" else {}
    hostile.update({"FX_BLIND": "1"} if "forged" in reaper else {})
    hostile.update({"FX_STOP_TEMPLATE": "1"} if "stopped" in reaper else {})
    env = cli_env(fx, FX_CHILD_PID=str(child_pid), **hostile)
    process = start_cli([*TINY, "--tokens", "16", "--backend", "fx_backends:spawn", "--out", str(tmp_path / "run")], env)
    helpers: list[str] = []
    try:
        wait_for(child_pid.exists, 120, "the back-end's helper and daemon to start", process)
        helpers = child_pid.read_text().split()
        assert len(helpers) == 2 and all(_alive(pid) for pid in helpers)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        wait_for(lambda: not any(_alive(pid) for pid in helpers), 15, "the back-end's helper and daemon to go")
        assert workers_of(process.pid, wait_s=15) == []
    finally:
        kill_group(process)
        for pid in helpers:
            if _alive(pid):
                os.kill(int(pid), signal.SIGKILL)


@pytest.mark.skipif(os.uname().machine != "x86_64" or not os.path.exists("/bin/sleep"),
                    reason="clone's system call number is x86-64's")
@pytest.mark.parametrize("forked,stops", [(True, False), (False, False), (True, True)])
def test_a_helper_made_the_templates_child_ends_with_a_run_that_ends_normally(fx, tmp_path, forked, stops):
    """A job's helper made with ``clone(CLONE_PARENT)`` is the worker's parent's child — the worker
    template's, or the command's for a fresh worker — outside the worker's tree; without the mark and
    in a session of its own it outlived a run that ended with exit 0. Neither forks anything but
    workers (and templates): at its end each kills every other child. A helper that stops the template
    once its worker is gone lived on too (the command killed the stopped template outright, which
    handed the helper to init), or left the template stopped for good (stopped after the command had
    its worker's status)."""
    from processes import _alive

    helper = tmp_path / "helper.pid"
    env = cli_env(fx, FX_HELPER=str(helper), FUSEDCE_WORKER_TEMPLATE="1" if forked else "0",
                  **({"FX_HELPER_STOPS": "1"} if stops else {}))
    result = run_cli([*TINY, "--tokens", "16", "--backend", "fx_backends:clone_parent", "--out", str(tmp_path / "run")],
                     env)
    pid, template = helper.read_text(), int((tmp_path / "helper.pid.parent").read_text())
    try:
        assert result.returncode == 0, result.stderr
        wait_for(lambda: not _alive(pid), 15, "the template's other child to go")
        if stops:
            wait_for(lambda: not _alive(template), 15, "the stopped template to go")
    finally:
        for left in (pid, template) if stops else (pid,):
            if _alive(left):
                os.kill(int(left), signal.SIGKILL)


@pytest.mark.skipif(os.uname().machine != "x86_64" or not os.path.exists("/bin/sh"),
                    reason="clone's system call number is x86-64's")
def test_a_helper_that_keeps_stopping_the_template_ends_with_it_after_kill_9(fx, tmp_path):
    """A job's helper, made the template's child, stopping and continuing it without pause; then
    ``kill -9`` of the command. The worker (or its reaper) killed the stopped template outright, so the
    template never ended its helpers: the helper lived on under init (7 runs in 7)."""
    from processes import _alive

    helper = tmp_path / "helper.pid"
    env = cli_env(fx, FX_HELPER=str(helper), FUSEDCE_WORKER_TEMPLATE="1", FX_HELPER_STOPS="loop")
    process = start_cli([*TINY, "--tokens", "16", "--backend", "fx_backends:clone_parent_hang",
                         "--out", str(tmp_path / "run")], env)
    pid = template = None
    try:
        wait_for(helper.exists, 60, "the helper")
        pid, template = helper.read_text(), int((tmp_path / "helper.pid.parent").read_text())
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        wait_for(lambda: not _alive(pid) and not _alive(template), 30, "the helper and the template to go")
    finally:
        kill_group(process)
        for left in (pid, template):
            if left and _alive(left):
                os.kill(int(left), signal.SIGKILL)


def test_a_process_the_caller_started_before_exec_outlives_the_command(tmp_path):
    """``monitor & exec fusedce-profile …``: the monitor is the command's child from its first
    instruction, and older than it; the command's end kills only the helpers its jobs made."""
    import subprocess

    from processes import _alive

    monitor = tmp_path / "monitor.pid"
    script = f"sleep 300 >/dev/null 2>&1 & echo $! > {monitor}; exec {sys.executable} -m fusedce_cli presets"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=cli_env())
    pid = monitor.read_text().strip()
    try:
        assert done.returncode == 0, done.stderr
        time.sleep(0.5)
        assert _alive(pid)
    finally:
        if _alive(pid):
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("backend", ["daemon", "hang", "exit"])
def test_a_daemon_a_backend_starts_outside_its_group_ends_with_the_run(fx, tmp_path, monkeypatch, backend):
    """A back-end that leaves the worker's process group (fork, setsid, fork) is adopted by the
    worker and killed when the worker ends: after a finished run, after a timed-out cell, and when
    the back-end ends the worker itself (the adopted daemon then passes to init: it bears the
    worker's mark, and the command ends it).

    The command runs in this process (``CliRunner``): the process tree under test is the worker's
    (its child subreaper, its end), which is a process of its own either way; a CLI process above it
    would only add its start-up."""
    from processes import _alive

    pid_file = tmp_path / "daemon.pid"
    monkeypatch.setenv("FX_DAEMON_PID", str(pid_file))  # the worker inherits this process's environment
    monkeypatch.setenv("FX_HANG_MARK", str(tmp_path / "hang.mark"))
    if backend == "exit":
        monkeypatch.setenv("FX_DAEMON_EXIT", "1")
    if backend == "hang":  # the daemon starts in a finished cell; the next cell hangs and times out
        args = ["--backend", "fx_backends:daemon", "--backend", "fx_backends:hang", "--cell-timeout", "2"]
    else:
        args = ["--backend", "fx_backends:daemon"]
    result = CliRunner().invoke(app, [*TINY, "--tokens", "16", *args, "--out", str(tmp_path / "run")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert pid_file.exists(), result.output
    daemon = pid_file.read_text()
    try:
        wait_for(lambda: not _alive(daemon), 10, "the back-end's daemon to end with its worker")
    finally:
        if _alive(daemon):
            os.kill(int(daemon), signal.SIGKILL)


def test_a_backend_that_alters_its_worker_alters_no_other_backends_cell(fx, tmp_path):
    """A user back-end runs in a worker no other back-end's cell runs in after it: one that replaces
    the worker's cell job and closes its input, then returns normally, leaves the next cells as
    they would be without it."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--tokens", "16", "--backend", "fx_backends:alters", "--backend",
                                      "torch", "--backend", "fusedce", "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    rows = {row["spec"]["backend"]: row for row in _rows(out)}
    assert rows["fx_backends:alters"]["status"] == "ok"
    for backend in ("torch", "fusedce"):
        assert rows[backend]["status"] == "ok", rows[backend].get("message")
        assert rows[backend]["peak_step_bytes"] > 16 * 256 * 4  # at least the logits, not the forged 7 bytes


def _group_alive(group: int) -> bool:
    """Whether a process of process group ``group`` is alive (zombies left out)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False


def _holding(text: str) -> list[int]:
    """Processes, stopped ones included (zombies left out), whose command line holds ``text``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                named = text.encode() in fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if named and state != "Z":
            found.append(int(entry))
    return found


def _beating(beat: Path) -> bool:
    """Whether the hopper touched its heartbeat file in the last half second."""
    try:
        return time.time() - beat.stat().st_mtime < 0.5
    except FileNotFoundError:
        return False


def _most_zombies_of_one_parent() -> int:
    """The most zombie processes on this machine with one parent (init's left out)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                state, ppid = fh.read().rsplit(b")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state == b"Z" and ppid != b"1":
            parents[int(ppid)] = parents.get(int(ppid), 0) + 1
    return max(parents.values(), default=0)


@pytest.mark.parametrize("session", ["kept", "new at every generation"])
@pytest.mark.parametrize("end", ["timed-out cell", "kill -9"])
def test_a_daemon_that_keeps_changing_its_pid_ends_with_the_run(fx, tmp_path, end, session):
    """A back-end's daemon in a session of its own that forks and lets its parent exit, without
    pause, outran a walk of the worker's children pid by pid; one that also calls ``setsid`` at every
    generation outran the kills of the process groups seen: each bears the worker's mark, and is
    stopped, then killed."""
    group_file, beat = tmp_path / "hopper.group", tmp_path / "hopper.group.beat"
    args = [*TINY, "--tokens", "16", "--backend", "fx_backends:hopper", "--cell-timeout", "3", "--out",
            str(tmp_path / "run")]
    hops = {"FX_HOPPER_SETSID": "1"} if session != "kept" else {}
    process = start_cli(args, cli_env(fx, FX_HOPPER_GROUP=str(group_file), **hops))
    zombies = []  # the most zombies the worker held: each exited generation is its child (a subreaper)
    try:
        wait_for(group_file.exists, 120, "the back-end's daemon to start", process)
        wait_for(lambda: _beating(beat) or zombies.append(_most_zombies_of_one_parent()), 10, "the daemon to hop")
        if end == "kill -9":
            os.kill(process.pid, signal.SIGKILL)
        while process.poll() is None and not zombies.append(_most_zombies_of_one_parent()):
            time.sleep(0.2)
        process.wait(timeout=60)
        wait_for(lambda: not _beating(beat), 15, "the daemon to end")
        time.sleep(1.0)
        assert not _beating(beat), "the daemon went on after a pause"
        assert not _holding(str(beat)), "a generation of the daemon was left (stopped, never killed)"
        assert max(zombies) < 2048, "the worker held the daemon's exited generations unwaited"
    finally:
        kill_group(process)
        for pid in _holding(str(beat)):  # a stopped survivor would never end itself
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 70  # a running survivor ends itself within 60 s
        while _beating(beat) and time.monotonic() < deadline:
            time.sleep(0.5)


def test_a_fresh_worker_has_imported_its_jobs_before_the_job_clock_starts(tmp_path):
    from fusedce_profiler.instrument.worker import Worker

    with Worker(tmp_path / "logs", preload=("cell",)) as worker:
        worker.wait_ready()  # what a job's time limit does not count
        assert "libtorch" in Path(f"/proc/{worker.pid}/maps").read_text()


def test_a_cpu_worker_sets_up_the_meter_and_the_loss_before_the_job_clock_starts(tmp_path):
    """The CPU meter's first start, then fusedce's first call (a custom op: torch imports
    ``torch._dynamo`` at its first call, about a second), ran inside a fresh worker's first cell
    and its time limit: after the warm-up, a metered fusedce step imports nothing."""
    import subprocess
    import sys

    probe = textwrap.dedent('''
        import sys
        import torch
        import fusedce
        from fusedce_profiler.instrument.protocol import CPU_WORKER_WARM_UP, MemoryMeter
        from fusedce_profiler.instrument.worker_child import _load
        for target in CPU_WORKER_WARM_UP:
            _load(target)()
        before = set(sys.modules)
        with MemoryMeter("cpu") as meter:
            meter.mark("step")
            hidden = torch.randn(8, 16, requires_grad=True)
            fusedce.linear_cross_entropy(hidden, torch.randn(32, 16), torch.randint(0, 32, (8,))).backward()
        print(sorted(set(sys.modules) - before))
    ''')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # the meter's start and the loss import nothing the warm-up did not


def test_a_worker_runs_its_warm_up_before_it_is_ready(tmp_path, monkeypatch):
    from fusedce_profiler.instrument.protocol import CPU_WORKER_WARM_UP
    from fusedce_profiler.instrument.worker import Worker

    (tmp_path / "fx_warm.py").write_text(textwrap.dedent(f'''
        def up():
            open({str(tmp_path / "warm")!r}, "w").close()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with Worker(tmp_path / "logs", warm_up=("fx_warm:up", *CPU_WORKER_WARM_UP)) as worker:
        worker.wait_ready()
        assert (tmp_path / "warm").exists()  # before any job was sent


# --- 4. NaN ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parity_failures(tmp_path_factory):
    """One grid of torch beside a NaN loss and a finite loss with infinite gradients (two parity
    probes, one run: the torch cell they are judged against is measured once)."""
    folder = tmp_path_factory.mktemp("backends")
    (folder / "fx_backends.py").write_text(BACKENDS)
    sys.path.insert(0, str(folder))
    try:
        out = tmp_path_factory.mktemp("parity") / "run"
        result = CliRunner().invoke(app, [*TINY, "--tokens", "16", "--backend", "torch", "--backend", "fx_backends:nan",
                                          "--backend", "fx_backends:nan_grad", "--out", str(out), "--json"])
    finally:
        sys.path.remove(str(folder))
    assert result.exit_code == 1, result.output
    return out, result


def _stored_line(out: Path, backend: str) -> str:
    return next(line for line in (out / RESULTS_FILE).read_text().splitlines() if f'"backend": "{backend}"' in line)


def test_a_nan_loss_is_a_parity_failure_stored_as_strict_json(parity_failures):
    out, result = parity_failures
    line = _stored_line(out, "fx_backends:nan")
    assert '"loss": "NaN"' in line and "NaN," not in line.replace('"NaN",', "")  # strict JSON
    json.loads(line)
    row = next(r for r in json.loads(result.stdout)["rows"] if r["backend"] == "fx_backends:nan")
    assert row["parity_ok"] is False
    assert "| fx_backends:nan | 16 |" in (out / "summary.md").read_text()
    table_row = next(line for line in (out / "summary.md").read_text().splitlines()
                     if line.startswith("| fx_backends:nan |"))
    assert "NaN ✗" in table_row
    assert "PARITY FAILURE: fx_backends:nan" in _plain(result.stderr)
    assert "NaN ✗" in result.stderr  # the terminal table


def test_a_finite_loss_with_infinite_gradients_is_a_parity_failure_stored_as_strict_json(parity_failures):
    out, result = parity_failures
    stored = json.loads(_stored_line(out, "fx_backends:nan_grad"),
                        parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert stored["parity"]["loss"] < 1e-3  # the loss itself is right
    row = next(r for r in json.loads(result.stdout)["rows"] if r["backend"] == "fx_backends:nan_grad")
    assert row["parity_ok"] is False
    assert "PARITY FAILURE: fx_backends:nan_grad" in _plain(result.stderr)
    assert "NaN ✗" in next(line for line in (out / "summary.md").read_text().splitlines()
                           if line.startswith("| fx_backends:nan_grad |"))


# --- 5. a worker that cannot start -----------------------------------------------------------

@pytest.mark.parametrize("limit_mb", [400, 500, 600, 700])
def test_an_address_space_too_small_for_torch_is_never_a_traceback(tmp_path, limit_mb):
    """``ulimit -v``: the command's own import of torch or of a library under it fails — a MemoryError,
    a shared object that cannot be mapped, an allocation refused — each said in one line, never a
    traceback (a MemoryError printed 78 lines). What fails first varies with the limit and the machine."""
    def limited():  # pragma: no cover - runs in the child
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))

    result = run_cli([*TINY, "--tokens", "16", "--backend", "torch", "--out", str(tmp_path / "run")], cli_env(),
                     preexec=limited)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) <= 1, result.stderr[-3000:]
    assert (result.returncode == 0) == (lines == []), result.stderr


@pytest.mark.parametrize("raised,line", [
    (MemoryError(), "error: out of memory in the command itself (its address-space limit, `ulimit -v`, or the "
                    "machine's)"),
    (SystemError("error return without exception set"),  # an unchecked allocation in an extension's import
     "error: the Python interpreter failed in the command itself (SystemError: error return without exception set)"),
    (ImportError("numpy failed\n\nOriginal error was: libx.so: failed to map segment from shared object",
                 name="numpy"),
     "error: could not import numpy: Original error was: libx.so: failed to map segment from shared object"),
])
def test_the_commands_own_memory_or_import_failure_is_one_line_and_exit_3(monkeypatch, capsys, raised, line):
    from fusedce_cli import ending, entry

    def fails():
        raise raised

    def leave(code):  # what os._exit would end the process with
        raise SystemExit(code)

    monkeypatch.setattr(ending, "main", fails)
    monkeypatch.setattr(entry, "_leave", leave)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as stopped:
            entry.main()
    finally:  # the entry point hands the signals to a command: this process's own come back
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert stopped.value.code == 3 and capsys.readouterr().err == line + "\n"


def test_a_run_stopped_by_a_worker_that_cannot_start_exits_3_though_a_back_end_failed_every_cell(tmp_path, fx):
    """The first worker starts and dies in its cell (the back-end ends it); the next cannot start, so the
    run stops. The back-end "failed in every cell" it was given (exit 1) but was not given them all: what
    could not run outweighs the check of what did."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import os, sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:  # the worker's interpreter only
            if os.path.exists(os.environ["FX_DIED"]):  # after a worker died in its cell
                sys.stderr.write("OSError: [Errno 11] Resource temporarily unavailable\\n")
                sys.stderr.flush()
                os._exit(1)
    '''))
    out = tmp_path / "run"
    result = run_cli([*TINY, "--tokens", "16,32", "--backend", "fx_backends:die", "--out", str(out)],
                     cli_env(hooks, fx, FX_DIED=str(tmp_path / "died")))
    message = _plain(result.stdout + result.stderr)
    assert "died at start-up" in message and "failed in every cell" in message, message
    assert result.returncode == 3, result.stderr
    assert "exit code 1" not in message  # the line names no code but the one the command returns

@pytest.mark.parametrize("command", [
    ["doctor", "--preset", "tiny", "--loss", "examples.doctor_losses:fused_loss", "--device", "cpu"],
    ["model", "--preset", "tiny", "--backend", "torch", "--batch", "2", "--seq", "16", "--device", "cpu", "--no-trace"],
])
def test_a_worker_the_open_files_limit_leaves_no_room_for_is_one_line_and_exit_3(tmp_path, command):
    """``ulimit -n 12``: the command starts, its worker's pipes cannot be made (a 50-line traceback, exit 1)."""
    def limited():  # pragma: no cover - runs in the child
        resource.setrlimit(resource.RLIMIT_NOFILE, (12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    out = tmp_path / "run"
    result = run_cli([*command, "--out", str(out)], cli_env(), cwd=Path(__file__).parents[1], preexec=limited)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: the worker (python -m fusedce_profiler.instrument.worker_child) could "
                                    "not be started: too many open files (this process's open-files limit, "
                                    "`ulimit -n`, is 12: raise it); the run stopped in "), result.stderr


def _workers_die_at_start(tmp_path: Path, last_words: str) -> Path:
    """A folder whose ``sitecustomize`` ends every worker's interpreter at its start with ``last_words``."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(textwrap.dedent(f'''
        import os, sys
        if "fusedce_profiler.instrument.worker_child" in sys.orig_argv:  # the worker's interpreter only
            sys.stderr.write({last_words!r} + "\\n")
            sys.stderr.flush()
            os._exit(1)
    '''))
    return broken


@pytest.mark.parametrize("command", [
    ["model", "--preset", "tiny", "--backend", "torch", "--batch", "2", "--seq", "16", "--device", "cpu", "--no-trace"],
    ["doctor", "--preset", "tiny", "--loss", "examples.doctor_losses:fused_loss", "--device", "cpu"],
    ["doctor", "--model", "examples.doctor_losses:fixed_model", "--loss", "examples.doctor_losses:fused_loss",
     "--device", "cpu"],  # the factory's worker
    [*TINY, "--tokens", "16", "--backend", "examples.user_model:wrapper_that_materialises"],  # the check's worker
])
def test_a_worker_that_dies_at_start_up_stops_every_command_with_exit_3(tmp_path, command):
    """Not only ``grid``: a worker that dies before any job ran (its interpreter's start-up) is no
    failure of a back-end, a loss or a factory, and every later worker would die the same way."""
    broken = _workers_die_at_start(tmp_path, "OSError: [Errno 11] Resource temporarily unavailable")
    result = run_cli([*command, "--out", str(tmp_path / "run")], cli_env(broken), cwd=Path(__file__).parents[1])
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "died at start-up: exited with code 1 (OSError: [Errno 11] Resource temporarily unavailable)" in lines[0]
    if "; log " in lines[0]:  # a log it names is there to read (a check's scratch folder is gone: none named)
        log = lines[0].split("; log ")[1].split(";")[0]
        assert (Path(__file__).parents[1] / log).is_file(), lines[0]


def test_a_worker_that_dies_at_start_up_is_named_with_its_log_and_exit_3(tmp_path):
    broken = _workers_die_at_start(tmp_path, "ModuleNotFoundError: No module named 'torch'")
    out = tmp_path / "run"
    result = run_cli([*TINY, "--tokens", "16", "--backend", "torch", "--out", str(out)], cli_env(broken))
    assert result.returncode == 3, result.stderr
    message = _plain(result.stderr)
    assert "the worker (python -m fusedce_profiler.instrument.worker_child) died at start-up: exited with code 1" in message
    assert "(ModuleNotFoundError: No module named 'torch')" in message
    log = message.split("; log ")[1].split(";")[0]
    assert Path(log).is_file() and Path(log).parent == out / "logs"
    assert "Traceback" not in result.stderr


# --- 12. a back-end that raises in every cell ---------------------------------------------------

def test_a_backend_raising_in_every_cell_names_its_log_and_fails_the_run(fx, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8,16", "--backend", "torch", "--backend",
                                      "fx_backends:boom", "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stdout.splitlines() if "fx_backends:boom" in line and line.startswith("[")]
    assert len(lines) == 2
    for line in lines:
        assert ": error: RuntimeError: boom (traceback in " in line
        log = Path(line.split("(traceback in ")[1].rstrip(")"))
        assert "RuntimeError: boom" in log.read_text() and "Traceback (most recent call last)" in log.read_text()
    assert "fx_backends:boom failed in every cell (2 of 2): exit code 1." in _plain(result.stdout)
    assert "error: RuntimeError: boom (traceback in logs/worker-" in (out / "summary.md").read_text()


# --- 6. I/O errors -------------------------------------------------------------------------------

def _file_size_limit(limit: int):
    def apply() -> None:  # in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_file_size_limit_while_storing_results_exits_2_and_resume_measures_the_cell_again(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, "--tokens", "8,16", "--backend", "torch", "--out", str(out)]
    cut = run_cli(args, cli_env(), preexec=_file_size_limit(1600))
    assert cut.returncode == 2, cut.stderr
    message = [line for line in cut.stderr.splitlines() if line.startswith("error:")]
    assert len(message) == 1 and "Traceback" not in cut.stderr
    assert f"{out / RESULTS_FILE}: File too large: the result of torch at 16 tokens" in message[0]
    assert f"--resume --out {out}" in message[0]
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "cut a last line left unfinished by an interrupted run; that cell is measured again" in _plain(resumed.stdout)
    assert [r["spec"]["tokens"] for r in _rows(out)] == [8, 16]


FINISHED = [*TINY, "--tokens", "8,16", "--backend", "torch"]
"""The grid of :func:`finished_run` (a session fixture, ``conftest.py``: made once, never changed)."""


def _copy(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of the finished folder, for a test that changes it (or may, on failure)."""
    import shutil

    out = tmp_path / "finished" / "run"
    shutil.copytree(finished_run, out, symlinks=True)
    return out


@pytest.mark.parametrize("limit_below", ["half a plot", "half the page"])
def test_a_file_size_limit_during_report_exits_2_and_leaves_the_old_report(finished_run, tmp_path, limit_below):
    run = _copy(finished_run, tmp_path)
    html = (run / "report.html").read_bytes()
    plots = sorted(p.name for p in (run / "plots").iterdir())
    assert plots
    smallest_plot = min(p.stat().st_size for p in (run / "plots").iterdir())
    limit = smallest_plot // 2 if limit_below == "half a plot" else len(html) // 2  # the page embeds every plot
    result = run_cli(["report", str(run)], cli_env(), preexec=_file_size_limit(limit))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert ": File too large" in result.stderr and str(run) in result.stderr
    assert (run / "report.html").read_bytes() == html
    assert sorted(p.name for p in (run / "plots").iterdir()) == plots  # no plot deleted
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]  # no temporary left


def test_a_report_that_cannot_be_written_after_a_run_says_the_cells_are_kept(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    rows = (run / RESULTS_FILE).read_text().splitlines()
    (run / RESULTS_FILE).write_text(rows[0] + "\n")  # the second cell still to measure
    (run / "summary.md").unlink()
    (run / "summary.md").mkdir()  # a page the report cannot replace
    result = CliRunner().invoke(app, [*FINISHED, "--out", str(run), "--resume"])
    assert result.exit_code == 2, result.output
    assert _plain(result.stderr).endswith(f"error: {run}/summary.md: Is a directory; the finished cells are kept in "
                                          f"{run}: `fusedce-profile report {run}` writes the report once that is mended")
    assert len(_rows(run)) == 2


def test_an_unwritable_out_folder_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--out", str(blocker / "run")])
    assert result.exit_code == 2
    assert f"--out {blocker / 'run'}: Not a directory" in _plain(result.stderr)


def test_a_read_only_out_folder_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o555)
    try:
        result = run_cli([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)], cli_env(),
                         as_unprivileged=True)
    finally:
        out.chmod(0o755)
    assert result.returncode == 2, result.stderr
    assert f"--out {out / LOCK_FILE}: Permission denied" in _plain(result.stderr)
    assert "Traceback" not in result.stderr and not list(out.iterdir())


# --- 7. report writes ---------------------------------------------------------------------------

def test_report_replaces_a_summary_linked_outside_the_folder_and_never_writes_through_it(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    outside = tmp_path / "outside.md"
    outside.write_text("not yours")
    (run / "summary.md").unlink()
    (run / "summary.md").symlink_to(outside)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert outside.read_text() == "not yours"
    assert not (run / "summary.md").is_symlink() and "torch" in (run / "summary.md").read_text()


def test_report_refuses_a_plots_folder_that_is_a_link(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plots = run / "plots"
    plots.rename(run.parent / "plots-moved")
    plots.symlink_to(elsewhere)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2
    assert "is a symbolic link" in _plain(result.stderr) and "Traceback" not in result.output
    assert not list(elsewhere.iterdir())


# --- 8-9. damaged result lines: --resume re-measures, report names the line ----------------------

def test_resume_notes_and_remeasures_an_ill_typed_row_and_report_names_the_line(finished_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    args = [*FINISHED, "--out", str(out)]
    lines = (out / RESULTS_FILE).read_text().splitlines()
    bad = json.loads(lines[1])
    bad["spec"]["tokens"] = "sixteen"  # ill-typed
    (out / RESULTS_FILE).write_text(lines[0] + "\n" + json.dumps(bad) + "\n")

    report = CliRunner().invoke(app, ["report", str(out)])
    assert f"note: {out.resolve() / RESULTS_FILE}:2: not a valid row (spec.tokens must be an integer" in \
        _plain(report.stdout)
    assert "1 of 2 cells — interrupted" in (out / "summary.md").read_text()

    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"note: {out / RESULTS_FILE}:2: not a valid row" in _plain(resumed.stdout)
    assert "that cell is measured again" in _plain(resumed.stdout)
    assert "[1/1] torch 16×32×256" in resumed.stdout  # only the damaged cell was measured
    assert "interrupted" not in (out / "summary.md").read_text()


def test_report_names_a_truncated_last_line(finished_run, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    first = (finished_run / RESULTS_FILE).read_text().splitlines(keepends=True)[0]
    (out / RESULTS_FILE).write_text(first + first[: len(first) // 2])  # a second line cut short
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{out.resolve() / RESULTS_FILE}:2: a last line cut short by an interrupted write" in _plain(result.stdout)


def test_an_escape_sequence_in_a_message_is_shown_never_obeyed(fx, tmp_path):
    """A back-end's message reaches the terminal, summary.md, report.html and results.csv (all read
    in a terminal too) with its control characters spelled out, on the run and on ``report``."""
    out = tmp_path / "run"
    run = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--backend", "fx_backends:escapes",
                                   "--out", str(out)])
    assert run.exit_code == 1, run.output
    rebuilt = CliRunner().invoke(app, ["report", str(out)])
    assert rebuilt.exit_code in (0, 1), rebuilt.output
    assert "RuntimeError: \\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b0m" in run.output
    stored = {name: (out / name).read_text() for name in ("summary.md", "report.html", "results.csv")}
    for where, text in {"grid": run.output, "report": rebuilt.output, **stored}.items():
        assert not set(text) & {"\x1b", "\x07", "\x9b"}, where
        assert "pwned" in text or where == "report", where
    assert "\\x1b" in stored["results.csv"]


@pytest.mark.parametrize("flag", ["--force", "--resume"])
def test_force_or_resume_never_touch_a_folder_no_run_wrote(tmp_path, flag):
    """``--out ~ --force`` removed the home folder's ``logs/`` and ``plots/`` and wrote a run
    beside its files (``--out / --force`` as root did so in /): a folder that holds no run's record
    is refused, whatever the flag."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "mine.txt").write_text("keep")
    (home / "notes.txt").write_text("keep")
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--out", str(home), flag])
    assert result.exit_code == 2, result.output
    assert f"--out {home}: not a run folder (it holds logs, notes.txt, and no run's record)" in _plain(result.stderr)
    assert sorted(p.name for p in home.rglob("*")) == ["logs", "mine.txt", "notes.txt"]


@pytest.mark.parametrize("command, kind", [
    (["explain", "--device", "cpu", "--preset", "tiny", "--seq", "32", "--naive", "3", "--fused", "2", "--card", "24"],
     "an explain"),
    (["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8", "--no-trace"], "a model"),
    (["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10"], "a parity"),
])
def test_resume_refuses_the_folder_of_another_kind_of_run(finished_run, tmp_path, command, kind):
    """``explain --resume`` into a grid's folder wrote its steps beside the grid's results and
    replaced its summary.md."""
    import shutil

    out = tmp_path / "grid"
    shutil.copytree(finished_run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    result = CliRunner().invoke(app, [*command, "--resume", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"--out {out}: the folder of a grid run (results.jsonl); --resume continues {kind} run" in \
        _plain(result.stderr)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before



def test_an_unwritable_home_leaves_no_matplotlib_folder_behind(tmp_path):
    """With neither ``MPLCONFIGDIR`` nor the home folder writable, matplotlib makes its configuration
    folder in the temporary folder and removes it at interpreter exit, which the command line's
    ``os._exit`` skips: the command removes it itself."""
    import shutil

    run = tmp_path / "m"
    shutil.copytree(Path(__file__).parent / "fixtures" / "h200_model", run)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in cli_env(HOME="/proc", TMPDIR=str(scratch)).items()
           if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    result = run_cli(["report", str(run)], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(run.glob("plots/*.png")), "the report drew no plot: matplotlib was not used"
    assert not list(scratch.glob("matplotlib-*")), sorted(p.name for p in scratch.iterdir())
