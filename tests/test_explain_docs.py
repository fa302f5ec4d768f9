"""docs/explain.md: every command and the Python example run as written, with the exit code stated."""
import re
import shlex
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "explain.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _commands() -> list[tuple[list[str], int]]:
    out = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            code = re.match(r"\s*exit (\d+)", comment)
            assert code, f"every command in the page states its exit code: {line}"
            out.append((shlex.split(command)[1:], int(code.group(1))))
    return out


@pytest.mark.parametrize("argv, code", _commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_every_command_of_the_page_exits_as_it_says(argv, code, tmp_path):
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    if "--device" not in argv and code == 0 or (torch.cuda.is_available() and "--device" not in argv):
        pytest.skip("a GPU run")
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "out")])
    assert result.exit_code == code, result.output
    if code == 2:
        assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_the_python_example_runs(tmp_path, monkeypatch):
    (example,) = _blocks("python")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(DOC), "exec"), {})
    assert (tmp_path / "why-python" / "summary.md").is_file()
