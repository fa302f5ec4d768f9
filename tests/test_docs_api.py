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


_RUN_IN_ORDER = """
import sys, traceback
for number, block in enumerate(BLOCKS):
    try:
        exec(compile(block, f"<docs/api.md block {number + 1}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        print(f"BLOCK {number + 1} FAILED", file=sys.stderr)
        sys.exit(1)
"""


@pytest.mark.slow
def test_every_example_on_the_page_runs(tmp_path):
    """The blocks run one after the other in one interpreter, each in a namespace of its own, as a
    reader pasting them into one Python session would (one torch import, not one per block)."""
    blocks, skipped = [], []
    for block in code_blocks(PAGE.read_text()):
        missing = _missing_module(block)
        (skipped if missing else blocks).append(missing or block)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = f"BLOCKS = {blocks!r}\n{_RUN_IN_ORDER}"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    assert len(blocks) >= 4, (len(blocks), skipped)  # grid, model, parity and report run everywhere


def test_every_option_of_a_command_is_a_keyword_of_its_function_as_the_page_says():
    """The page's rule, checked: each long option is the keyword of the same name, or that name with
    the unit the page lists (``explain`` takes those of ``validate`` too)."""
    import importlib
    import inspect

    import typer

    from fusedce_cli.app import app

    functions = {"grid": "fusedce_profile.grid:run_grid", "model": "fusedce_profile.model:profile_model",
                 "parity": "fusedce_profile.parity:parity", "doctor": "fusedce_profile.doctor:doctor",
                 "explain": "fusedce_profile.explain:explain fusedce_profile.explain:validate"}
    with_unit = {("doctor", "timeout"): "timeout_s", ("doctor", "memory_limit"): "memory_limit_gb"}
    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    commands = typer.main.get_command(app).commands
    for command, targets in functions.items():
        keywords = {keyword for target in targets.split() for keyword in inspect.signature(
            getattr(importlib.import_module(target.split(":")[0]), target.split(":")[1])).parameters}
        for param in commands[command].params:
            option = next((o for o in param.opts if o.startswith("--")), None)
            if option in (None, "--json"):
                continue
            keyword = with_unit.get((command, option[2:].replace("-", "_")), option[2:].replace("-", "_"))
            assert keyword in keywords, (command, option)
            if keyword != option[2:].replace("-", "_"):
                assert f"`{option}` is `{keyword}=`" in " ".join(page.split()), (command, option)
