"""Every command docs/doctor.md shows runs as it says: each ``$ fusedce-profile …`` line with the
exit code written under it (``# exit N``), and the Python example."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import REPO, cli_env, run_cli

DOC = REPO / "docs" / "doctor.md"
COMMANDS = re.findall(r"```console\n\$ fusedce-profile (.+)\n# exit (\d+)\n```", DOC.read_text())
PYTHON = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_shows_commands_and_a_python_example():
    assert len(COMMANDS) >= 2 and len(PYTHON) == 1


@pytest.mark.parametrize("command, code", COMMANDS, ids=[c.split("--loss ")[1].split()[0] for c, _ in COMMANDS])
def test_each_documented_command_exits_as_documented(tmp_path, command, code):
    result = run_cli(shlex.split(command), cli_env(), cwd=tmp_path, timeout=300)
    assert result.returncode == int(code), result.stdout + result.stderr
    out = shlex.split(command)[shlex.split(command).index("--out") + 1]
    assert (tmp_path / out / "doctor.json").is_file() and (tmp_path / out / "summary.md").is_file()


def test_the_python_example_runs(tmp_path):
    result = subprocess.run([sys.executable, "-c", PYTHON[0]], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (Path(tmp_path) / "doctor-python" / "doctor.json").is_file()
