"""A clean install: the wheel adds only the project's own names to site-packages, carries every
module of the five package folders, and its command works beside a project that has a package
called ``cli`` of its own."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"fusedce": "fusedce", "fusedce_profile": "fusedce_profile", "profiler": "fusedce_profiler",
           "reports": "fusedce_reports", "cli": "fusedce_cli"}
"""Repository folder -> the name it is installed under."""
TOP_LEVEL = set(FOLDERS.values())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (the build leaves nothing in the repository)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("fusedce-*.whl")
    return path


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_installs_only_the_projects_own_top_level_names(wheel):
    top = {name.split("/")[0] for name in _names(wheel)}
    dist_info = {name for name in top if name.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == TOP_LEVEL


def test_wheel_carries_every_module_of_the_package_folders(wheel):
    names = set(_names(wheel))
    missing = []
    for folder, installed in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            inside = f"{installed}/{path.relative_to(ROOT / folder).as_posix()}"
            if inside not in names:
                missing.append(inside)
    assert missing == []


def test_command_runs_beside_a_project_with_its_own_cli_package(wheel, tmp_path):
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                                "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    project = tmp_path / "project"
    (project / "cli").mkdir(parents=True)
    (project / "cli" / "__init__.py").write_text("raise ImportError('the project’s own cli package')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(site)])}
    code = ("import sys, fusedce_cli, fusedce_profiler; "
            f"assert fusedce_cli.__file__.startswith({str(site)!r}), fusedce_cli.__file__; "
            f"assert fusedce_profiler.__file__.startswith({str(site)!r}), fusedce_profiler.__file__; "
            "from fusedce_cli.ending import main; sys.argv = ['fusedce-profile', '--help']; main()")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project, env=env,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "Profile the memory, time and parity" in shown.stdout
    for command in ("grid", "report", "model", "parity"):
        assert command in shown.stdout
