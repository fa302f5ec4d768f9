"""A signal while the command line is still importing (seconds: torch, matplotlib) ends it in one
line with its exit code — never a traceback of the import machinery, never silently."""
from __future__ import annotations

import signal

import pytest

from processes import cli_env, kill_group, start_cli

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

        time.sleep(0.3)  # within the imports, which take seconds
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        kill_group(process)
    assert process.returncode == code, (out, err)
    assert err.strip() == f"fusedce-profile: stopped by {signal.Signals(signum).name} while starting; nothing was run"
    assert not (tmp_path / "never").exists()
