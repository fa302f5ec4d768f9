"""``docs/api.md``: every code block on the page runs, in order, in a fresh folder (the examples
build on each other: ``build_report`` renders the grid the first example wrote)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
FUNCTIONS = ("run_grid", "profile_model", "parity", "build_report", "doctor", "explain")


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _missing_module(block: str) -> str | None:
    """The ``fusedce_profile`` submodule a block imports that this tree does not have."""
    for name in re.findall(r"from (fusedce_profile\.\w+) import", block):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def test_the_page_has_an_example_for_every_command_function():
    blocks = code_blocks(PAGE.read_text())
    for function in FUNCTIONS:
        assert any(re.search(rf"\b{function}\(", block) for block in blocks), function


@pytest.mark.slow
def test_every_example_on_the_page_runs(tmp_path):
    ran, skipped = 0, []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for block in code_blocks(PAGE.read_text()):
        missing = _missing_module(block)
        if missing:
            skipped.append(missing)
            continue
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{block}\n{done.stderr}"
        ran += 1
    assert ran >= 4, (ran, skipped)  # grid, model, parity and report run everywhere
