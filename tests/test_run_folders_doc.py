"""docs/run-folders.md: every command it shows is run here and answers as the page says; the
limits it states are the ones the reader applies."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fusedce_cli import exit_codes
from fusedce_profiler.instrument import confined
from processes import REPO, cli_env

PAGE = (REPO / "docs" / "run-folders.md").read_text()


def _console_steps() -> list[tuple[str, int, str]]:
    """(command, expected exit code, expected message) of each ``$`` line of the console blocks."""
    steps = []
    for block in re.findall(r"```console\n(.*?)```", PAGE, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append([line[2:], exit_codes.OK, ""])
            elif line.startswith("exit "):
                code, _, message = line[len("exit "):].partition(": ")
                steps[-1][1:] = [int(code), message]
    return [tuple(step) for step in steps]


@pytest.mark.slow
def test_every_command_of_the_page_answers_as_it_says(tmp_path):
    steps = _console_steps()
    assert len(steps) >= 4 and any(code == exit_codes.BAD_INPUT for _, code, _ in steps)
    env = cli_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for command, code, message in steps:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == code, (command, done.stdout, done.stderr)
        assert message in " ".join(done.stderr.split()), (command, done.stderr)
        assert "Traceback" not in done.stderr


def test_the_limits_the_page_states_are_the_readers():
    text = " ".join(PAGE.split())
    assert f"`environment.json` {confined.SIZE_LIMITS['environment.json'] >> 20} MiB" in text
    assert f"`*.timeline.json` {confined.SIZE_LIMITS['.timeline.json'] >> 20} MiB" in text
    assert f"a JSON-lines file {confined.SIZE_LIMITS['results.jsonl'] >> 20} MiB" in text
    assert f"each line at most {confined.MAX_LINE_BYTES >> 20} MiB" in text
    assert f"deeper than {confined.MAX_NESTING} levels" in text
    for name in ("plan.json", "parity.json", "doctor.json", "explain.json", "fit.json"):
        assert confined.SIZE_LIMITS[name] == 16 << 20 and f"`{name}`" in text


def test_the_number_ranges_the_page_states_are_the_checks():
    from fusedce_profile import ranges

    text = " ".join(PAGE.split())
    assert ranges.MAX_SIZE == 2**31 - 1 and "a size past 2³¹ − 1" in text
    assert ranges.MAX_SECONDS == 7 * 24 * 3600 and "a time limit past a week" in text


def test_the_fault_suite_the_page_lists_is_the_one_pytest_marks():
    section = PAGE.split("## The fault suite")[1].split("\n### ")[0]
    listed = set(re.findall(r"`(?:tests/)?(test_\w+\.py)`", section))
    mark = re.compile(r"^(pytestmark = pytest\.mark\.faults|@pytest\.mark\.faults)\b", re.M)
    marked = {path.name for path in (REPO / "tests").glob("test_*.py") if mark.search(path.read_text())}
    assert listed == marked
