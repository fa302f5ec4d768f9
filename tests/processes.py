"""Process helpers for fault-injection tests: the CLI in its own process group, bounded waits,
and a census of what is still alive (read from /proc; Linux only).

Every process the test session starts inherits :data:`SESSION_VARIABLE` (set by
``conftest.py``), so a process that outlived its parent — reparented to init, its parent's
pid gone from its command line — is still found by :func:`session_processes`.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SESSION_VARIABLE = "FUSEDCE_TEST_SESSION"
REPO = Path(__file__).resolve().parent.parent


def _alive(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _cmdline(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def workers_of(parent_pid: int, wait_s: float = 0.0) -> list[int]:
    """Pids of live ``fusedce_profiler.instrument.worker`` processes started by ``parent_pid`` (waits up to ``wait_s``
    for them to go): fresh ones, and those forked from its worker template (whose command line they
    share); the template itself, which lives as long as ``parent_pid`` by design, is not one."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
                 and b"fusedce_profiler.instrument.worker_child" in (args := _cmdline(pid)) and str(parent_pid).encode() in args
                 and _alive(pid) and not (b"template" in args and _parent(pid) == parent_pid)]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def is_ours(args: list[bytes]) -> bool:
    """Whether a command line is a worker or a ``fusedce-profile`` run (``python -m fusedce_cli``, the script)."""
    return (b"fusedce_profiler.instrument.worker_child" in args or any(arg.endswith(b"fusedce-profile") for arg in args)
            or any(a == b"-m" and b == b"cli" for a, b in zip(args, args[1:])))


def session_processes(marker: str, wait_s: float = 0.0, spare: set[int] = frozenset()) -> list[tuple[int, str]]:
    """(pid, command line) of live workers and CLI runs (:func:`is_ours`) other than this
    process, its worker templates (which live as long as it does, by design) and ``spare`` whose
    environment holds ``SESSION_VARIABLE=marker``."""
    from fusedce_profiler.instrument.template import template_pids

    spare = set(spare) | set(template_pids())
    entry = f"{SESSION_VARIABLE}={marker}".encode()
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in {os.getpid(), *spare} or not is_ours(args := _cmdline(pid)):
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            if entry in environ and _alive(pid):
                found.append((int(pid), b" ".join(args).decode(errors="replace")))
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def cli_env(*paths: str | Path, **variables: str) -> dict:
    """The environment of a CLI subprocess: this one's, with ``paths`` (and the repository)
    first on PYTHONPATH and ``variables`` set."""
    pythonpath = [str(p) for p in paths] + [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "COLUMNS": "200", **variables}


def _without_dac_override() -> None:  # pragma: no cover - runs in the child
    """As root, drop the capabilities that ignore file permissions (so a read-only folder is one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP: gone after exec


CONSOLE_SCRIPT = Path(sys.executable).parent / "fusedce-profile"


def start_cli(args: list[str], env: dict, cwd: str | Path | None = None, *, preexec=None,
              script: bool = False, **kwargs) -> subprocess.Popen:
    """``python -m fusedce_cli`` (or, with ``script``, the installed ``fusedce-profile`` console script,
    which unlike ``python -m`` does not put the current folder on the path) with ``args``, in
    its own session and process group (signals reach it and nothing else of the test);
    stdout and stderr captured as text."""
    command = [str(CONSOLE_SCRIPT)] if script else [sys.executable, "-m", "fusedce_cli"]

    def prepare() -> None:  # pragma: no cover - runs in the child
        # as a terminal's Ctrl-C and hang-up find it, even when the suite runs under `nohup` or `cmd &`
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if preexec is not None:
            preexec()

    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*command, *args], env=env, cwd=cwd or REPO, text=True, start_new_session=True,
                            preexec_fn=prepare, **kwargs)


def run_cli(args: list[str], env: dict, cwd: str | Path | None = None, *, timeout: float = 180,
            as_unprivileged: bool = False, preexec=None, script: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI to its end (bounded: killed with its group after ``timeout``). With
    ``as_unprivileged``, a root test drops the capabilities that override file permissions."""
    if as_unprivileged and os.geteuid() == 0:
        preexec = _without_dac_override
    process = start_cli(args, env, cwd, preexec=preexec, script=script)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        raise AssertionError(f"fusedce-profile {' '.join(args)} ran past {timeout} s:\n{out}\n{err}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process``'s group (a test's cleanup: nothing it started survives the test)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen | None = None) -> None:
    """Poll ``predicate`` every 0.1 s; fail after ``timeout`` seconds (or when ``process`` ended)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the CLI ended (exit {process.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def catches(pid: int, *signals: int) -> bool:
    """Whether process ``pid`` has a handler of its own for every one of ``signals`` (its
    ``SigCgt`` mask in /proc): from then on a signal reaches its code, not the default action."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return all(caught >> (sig - 1) & 1 for sig in signals)

