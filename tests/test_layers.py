"""The layers import one way: fusedce ← profiler ← reports ← cli, and importing them changes nothing.

``profiler`` measures and stores, ``reports`` renders stored files, ``cli`` drives both. A
renderer imported by the profiler would pull plotting into the measurement (and into a user's
training job); the loss core must not depend on the tool built around it.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the packages it must never import (at module level or inside a function)
FORBIDDEN = {
    "fusedce": ("profiler", "reports", "cli", "benchmarks"),
    "profiler": ("reports", "cli", "benchmarks"),
    "reports": ("cli", "benchmarks"),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_the_layers_above_it(package):
    offending = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN[package]:
                offending.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offending == []


def test_importing_every_package_leaves_matplotlibs_backend_alone():
    code = ("import matplotlib; matplotlib.use('svg'); "
            "import fusedce, profiler, profiler.training, reports, reports.build, reports.model_report, "
            "reports.attribution_tables, reports.parity_report, reports.doctor_report, reports.plots, "
            "reports.plots.model, reports.timeline, cli.app; "
            "import matplotlib.pyplot; print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "svg"
