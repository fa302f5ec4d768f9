"""``fusedce-profile report DIR``: rebuild from a stored results file, exit codes."""
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.records import CellResult

FIXTURE = Path(__file__).parent / "fixtures" / "h200_anchors"


def _copy_fixture(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("results.jsonl", "environment.json"):
        shutil.copy(FIXTURE / name, run / name)
    return run


def test_report_rebuilds_from_the_fixture_without_a_gpu(tmp_path):
    run = _copy_fixture(tmp_path)
    result = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["cells"] == {"total": 33, "ok": 32, "oom": 1}
    assert summary["parity_failed"] is False
    assert all(Path(p).is_file() for p in summary["plots"])
    assert "36.9 GiB (92%)" in (run / "summary.md").read_text()


def test_report_exits_1_when_a_cell_fails_its_parity_tolerance(tmp_path):
    run = _copy_fixture(tmp_path)
    lines = (run / "results.jsonl").read_text().splitlines()[:2]  # torch and torch-compile, 8k tokens
    broken = CellResult.from_dict(json.loads(lines[0]))
    broken.parity.grad_weight = 0.5  # far beyond amp-bf16's 3e-2
    lines[0] = store.dumps(broken.to_dict())
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 1
    assert "PARITY FAILURE: torch" in " ".join(result.stdout.split())


def test_report_of_a_folder_without_results_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "no results.jsonl" in result.stderr


def test_report_of_a_corrupt_results_file_names_every_line_it_skipped(tmp_path):
    (tmp_path / "results.jsonl").write_text("{broken\n{}\n")
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "results.jsonl:1" in result.stdout and "results.jsonl:2" in result.stdout
    assert "results.jsonl:1" in (tmp_path / "summary.md").read_text()
