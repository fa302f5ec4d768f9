"""The packages stay readable: no module over 400 lines, no import cycle inside the profiler, and the
repository's root holds the design's folders and files only."""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("fusedce", "profiler", "reports", "cli", "fusedce_profile")
MAX_LINES = 400
PROFILER = ROOT / "profiler"
PROFILER_NAME = "fusedce_profiler"


def test_no_module_is_over_400_lines():
    long = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == []


#: What the repository's root may hold (tracked): the design's folders, the project's files.
ROOT_ENTRIES = {".ci", ".gitignore", "README.md", "pyproject.toml", "benchmarks", "docs", "examples", "tests",
                *PACKAGE_FOLDERS}


def test_the_root_holds_only_the_design_s_folders_and_files():
    """A stray file committed at the root (a pid file a script left, a scratch note) is caught here."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert {line.split("/", 1)[0] for line in tracked.splitlines()} - ROOT_ENTRIES == set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PROFILER).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PROFILER_NAME, *parts])


def _imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The profiler modules ``path`` (module ``name``) imports, anywhere in it (module level or in a
    function): ``from a.b import c`` counts as ``a.b.c`` when that is a module, else ``a.b``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the profiler modules it imports."""
    paths = {_module_name(path): path for path in sorted(PROFILER.rglob("*.py"))}
    known = set(paths)
    return {name: _imported_modules(path, name, known) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as [a, b, ..., a], or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_graph_sees_relative_absolute_and_function_level_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    source = "import fusedce_profiler.x\nfrom . import y\ndef f():\n    from fusedce_profiler.z import thing\n"
    path = tmp_path / "pkg" / "m.py"
    path.write_text(source)
    known = {"fusedce_profiler.x", "fusedce_profiler.pkg.y", "fusedce_profiler.z", "fusedce_profiler.pkg.m"}
    assert _imported_modules(path, "fusedce_profiler.pkg.m", known) == {
        "fusedce_profiler.x", "fusedce_profiler.pkg.y", "fusedce_profiler.z"}


def test_profiler_has_no_import_cycle():
    assert find_cycle(import_graph()) == []
