"""benchmarks/frontier_plot.py on a committed run: one panel per case, a run split over processes drawn as one."""
from pathlib import Path

from benchmarks.frontier_goals import read_cases
from benchmarks.frontier_plot import main
from fusedce_reports.frame import results_frame
from fusedce_reports.frontier import frontiers

RUN = Path(__file__).resolve().parents[1] / "benchmarks/results/frontier-h100-2026-12-07"
PARTS = [RUN / "frontier/frontier.jsonl", RUN / "frontier-rest/frontier.jsonl"]


def test_the_figure_has_a_panel_for_every_case_of_the_run(tmp_path):
    cases = {key: cells for part in PARTS for key, cells in read_cases(part).items()}
    panels = frontiers(results_frame([cell for cells in cases.values() for cell in cells]), every_size=True)
    assert len(panels) == len(cases) == 11  # Llama-3 at 8k and 32k tokens are two panels of one head
    assert {(f.head, f.tokens) for f in panels} >= {("4096×128256", 8192), ("4096×128256", 32768)}
    assert main([*map(str, PARTS), "-o", str(tmp_path / "frontier.png")]) == 0
    assert (tmp_path / "frontier.png").read_bytes().startswith(b"\x89PNG")


def test_a_missing_or_empty_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(PARTS[0]), str(tmp_path / "nothing.jsonl"), "-o", str(tmp_path / "f.png")]) == 2
    (tmp_path / "empty.jsonl").write_text('{"kind": "gemm"}\n')
    assert main([str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "f.png")]) == 2
    (tmp_path / "garbled.jsonl").write_text('{"kind": "cell", "case"\n')
    assert main([str(tmp_path / "garbled.jsonl"), "-o", str(tmp_path / "f.png")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and "nothing.jsonl is not a file" in errors[0] and "holds no measured cell" in errors[1]
    assert "not a frontier run's records (JSONDecodeError" in errors[2]
    assert not (tmp_path / "f.png").exists()
