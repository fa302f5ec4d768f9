"""A newcomer follows the README literally: a copy of the repository, a fresh virtual
environment, the README's install line and its main command, then the claims the README makes
about what that command prints and writes.

Run by ``.ci/run`` (``FUSEDCE_NEWCOMER=1``), skipped elsewhere: it installs torch and the
project's dependencies into a new environment and runs the default grid on the CPU (minutes).
The one line not run as written is the CPU-torch install, whose index the CI machine cannot
reach: ``FUSEDCE_NEWCOMER_TORCH`` (set by ``.ci/run``) is the line that installs the same CPU
build there; without it the README's line runs as written.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pages import README, fenced_blocks, logical_lines
from processes import REPO, SESSION_VARIABLE, session_processes

pytestmark = pytest.mark.skipif(os.environ.get("FUSEDCE_NEWCOMER") != "1",
                                reason="the newcomer test runs in .ci/run (FUSEDCE_NEWCOMER=1)")

#: What a fresh clone holds; what a checkout builds or installs is left behind.
LEFT_BEHIND = shutil.ignore_patterns(".git", ".venv*", ".ci-venv", "__pycache__", "*.egg-info", "build", "dist",
                                     ".pytest_cache", "fusedce-profile-*")


def _shell(line: str, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_newcomer_who_follows_the_readme_gets_the_report_it_promises(tmp_path):
    lines = logical_lines(fenced_blocks(README.read_text(), "bash")[0])
    torch_line = next(line for line in lines if line.startswith("pip install torch"))
    main_line = next(line for line in lines if line.endswith("&& fusedce-profile"))
    clone = tmp_path / "fusedce"
    shutil.copytree(REPO, clone, ignore=LEFT_BEHIND)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), COLUMNS="120")

    started = time.monotonic()
    install = _shell(os.environ.get("FUSEDCE_NEWCOMER_TORCH") or torch_line, clone, env, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    installed = time.monotonic()
    run = _shell(main_line, clone, env, timeout=900)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    print(f"newcomer: torch {installed - started:.0f} s, `{main_line}` {time.monotonic() - installed:.0f} s")

    # What the README says the main command prints: one line per cell, a summary, where the report is.
    out = " ".join(run.stdout.split())
    # amp-bf16, or fp32 where the CPU has no native bf16 product (the heading says which, and why)
    fp32 = "default run on cpu: H=768 V=32777; tokens 512, 1024, 2048; fp32 (this CPU multiplies bf16" in out
    assert fp32 or "default run on cpu: H=768 V=32777; tokens 512, 1024, 2048; amp-bf16;" in out
    assert "back-ends torch, torch-compile, fusedce" in out
    assert all(f"[{k}/9]" in out for k in range(1, 10))
    assert not re.search(r"USDT|Traceback", run.stdout + run.stderr)
    (folder,) = clone.glob("fusedce-profile-*")  # the default folder ./fusedce-profile-YYYYmmdd-HHMMSS
    assert re.fullmatch(r"fusedce-profile-\d{8}-\d{6}", folder.name)
    assert "Report:" in out and folder.name in out
    for part in ("summary.md", "report.html", "results.csv", "results.jsonl", "plots/peak_memory.png",
                 "plots/saving.png", "plots/time.png"):
        assert (folder / part).is_file(), part

    # What the README says the CPU run shows: fusedce above torch at 512 tokens, the stated saving at 2048.
    cells = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        cells[(row["spec"]["backend"], row["spec"]["tokens"])] = row["peak_step_bytes"]
    assert (cells[("fusedce", 512)] < cells[("torch", 512)]) if fp32 else (cells[("fusedce", 512)] > cells[("torch", 512)])
    saving = 1 - cells[("fusedce", 2048)] / cells[("torch", 2048)]
    said = " ".join(README.read_text().split())
    assert (f"{saving:.0%} less at 2048 ([" in said) if fp32 else (f"{saving:.0%} less at 2048 in amp-bf16" in said)
    assert not session_processes(os.environ[SESSION_VARIABLE], wait_s=5.0)
