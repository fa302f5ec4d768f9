"""The layers import one way, and importing them changes nothing.

Between the folders: fusedce ← profiler ← reports ← cli (installed as ``fusedce``,
``fusedce_profiler``, ``fusedce_reports``, ``fusedce_cli``). ``profiler`` measures and stores,
``reports`` renders stored files, ``cli`` parses and prints. A renderer imported by the profiler
would pull plotting into the measurement (and into a user's training job); the loss core must
not depend on the tool built around it.

Inside ``profiler``: the instrument imports neither the judgements nor the grid, and no
judgement imports another one.
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
    "fusedce": ("fusedce_profiler", "fusedce_profile", "fusedce_reports", "fusedce_cli", "benchmarks"),
    "profiler": ("fusedce_reports", "fusedce_cli", "fusedce_profile", "benchmarks"),
    "reports": ("fusedce_cli", "fusedce_profile", "benchmarks"),
    "profiler/instrument": ("fusedce_profiler.judgements", "fusedce_profiler.grid"),
    "profiler/judgements/parity.py": ("fusedce_profiler.judgements.doctor", "fusedce_profiler.judgements.explain",
                                      "fusedce_profiler.judgements.fit"),
    "profiler/judgements/doctor": ("fusedce_profiler.judgements.parity", "fusedce_profiler.judgements.explain",
                                   "fusedce_profiler.judgements.fit"),
    "profiler/judgements/explain": ("fusedce_profiler.judgements.parity", "fusedce_profiler.judgements.doctor"),
    "profiler/judgements/fit.py": ("fusedce_profiler.judgements.parity", "fusedce_profiler.judgements.doctor",
                                   "fusedce_profiler.judgements.explain"),
}
# The names the old, generic top-level packages had: nothing may import them any more.
GENERIC = ("profiler", "reports", "cli")


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
    where = ROOT / package
    for path in sorted(where.rglob("*.py")) if where.is_dir() else [where]:
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                offending.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offending == []


def test_nothing_imports_the_generic_top_level_names():
    offending = []
    for folder in ("fusedce", "fusedce_profile", "profiler", "reports", "cli", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _imports(path):
                if name.split(".")[0] in GENERIC:
                    offending.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offending == []


def test_importing_every_package_leaves_matplotlibs_backend_alone():
    code = ("import matplotlib; matplotlib.use('svg'); "
            "import fusedce, fusedce_profiler, fusedce_profiler.judgements, fusedce_reports, fusedce_reports.build, fusedce_reports.model_report, "
            "fusedce_reports.attribution_tables, fusedce_reports.parity_report, fusedce_reports.doctor_report, fusedce_reports.plots, "
            "fusedce_reports.plots.model, fusedce_reports.timeline, fusedce_cli.app; "
            "import matplotlib.pyplot; print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "svg"
