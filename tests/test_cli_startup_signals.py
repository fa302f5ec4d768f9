"""A signal while the command line is still importing ends it in one line with its exit code —
never a traceback of the import machinery, never silently."""
from __future__ import annotations

import signal

import pytest

from processes import catches, cli_env, kill_group, start_cli

pytestmark = pytest.mark.faults


def _default_sigint() -> None:  # pragma: no cover - runs in the child
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's Ctrl-C finds it, even under `cmd &`


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("script", [True, False], ids=["console-script", "python-m"])
def test_a_signal_while_starting_is_one_line_and_its_exit_code(tmp_path, signum, code, script):
    process = start_cli(["grid", "--device", "cpu", "--out", str(tmp_path / "never")], cli_env(),
                        preexec=_default_sigint, script=script)
    try:
        import time

        # Aimed at the moment the start-up handlers are in place (the last of them: SIGHUP), within the
        # imports (0.2 s: torch waits for first use). Earlier, the interpreter itself is starting and
        # the kernel's default action ends it: no program can answer a signal before it runs.
        deadline = time.monotonic() + 30
        while not catches(process.pid, signal.SIGHUP) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        kill_group(process)
    assert process.returncode == code, (out, err)
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    # on a loaded machine the signal can also land once the command began: one line either way
    assert err.strip() in (f"fusedce-profile: stopped by {name} while starting; nothing was run",
                           f"fusedce-profile: stopped by {name} before the command had anything to keep")
    assert not (tmp_path / "never").exists()


SLOW_MODULE = """import os, pathlib, time
pathlib.Path(os.environ["IMPORT_STARTED"]).touch()
time.sleep(120)
def f(hidden, weight, target, bias=None):
    return hidden.sum()
"""
EXPLAIN = ["explain", "--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu", "--preset", "tiny",
           "--seq", "32", "--attention", "sdpa", "--untied", "--no-checkpointing", "--no-eval-step",
           "--fused-backend", "slow_import:f"]
GRID = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--tokens", "8", "--backend", "torch",
        "--backend", "slow_import:f"]


@pytest.mark.parametrize("args, signum, code", [(GRID, signal.SIGHUP, 129), (EXPLAIN, signal.SIGTERM, 143),
                                               (GRID, signal.SIGINT, 130)], ids=["grid-hup", "explain-term", "grid-int"])
def test_a_signal_while_a_user_module_is_checked_is_one_line_and_leaves_nothing(tmp_path, args, signum, code):
    """The command has started (its own signal handling) but has nothing to keep yet: its check
    worker is importing the user's module. One line, the signal's exit code, no folder, no worker,
    no temporary folder left."""
    from processes import wait_for, workers_of

    (tmp_path / "slow_import.py").write_text(SLOW_MODULE)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    started = tmp_path / "import-started"
    env = cli_env(tmp_path, IMPORT_STARTED=str(started), TMPDIR=str(scratch))
    process = start_cli([*args, "--out", str(tmp_path / "never")], env, cwd=tmp_path, preexec=_default_sigint)
    try:
        wait_for(started.exists, 120, "the check worker importing the module", process)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
        assert not workers_of(process.pid, wait_s=5)
    finally:
        kill_group(process)
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert process.returncode == code, (out, err)
    assert err.strip() == f"fusedce-profile: stopped by {name} before the command had anything to keep", (out, err)
    assert not (tmp_path / "never").exists()
    assert list(scratch.iterdir()) == []


_NUMPY_CUT = """
import builtins, os, signal, sys
from fusedce_cli import entry

entry._previous[signal.SIGINT] = signal.signal(signal.SIGINT, entry._stop_while_starting)  # as main() does
real_import = builtins.__import__

def cut(name, *args, **kwargs):
    if name == "numpy" and "numpy" not in sys.modules:  # a Ctrl-C as NumPy's import begins
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)

builtins.__import__ = cut
entry.command_starting()
import torch
print("ran on; numpy whole:", hasattr(sys.modules.get("numpy"), "subtract"))
"""


def test_a_signal_while_numpy_is_imported_ends_the_start_in_one_line():
    """torch's start-up imports NumPy from its C module and drops whatever that import raised: a Ctrl-C landing
    there was swallowed (the command ran on, or its report failed on a half-imported NumPy, exit 1). NumPy is
    imported before the command has the signals, so the start-up handler ends it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NUMPY_CUT], capture_output=True, text=True, timeout=120,
                          env=cli_env())
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stderr.strip() == "fusedce-profile: stopped by Ctrl-C while starting; nothing was run"
