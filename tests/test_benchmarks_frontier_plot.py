"""benchmarks/frontier_plot.py on a committed H200 run: one panel per case, bad paths in one line."""
from pathlib import Path

from benchmarks.frontier_goals import read_cases
from benchmarks.frontier_plot import main
from fusedce_reports.frame import results_frame
from fusedce_reports.frontier import frontiers

RUN = Path(__file__).resolve().parents[1] / "benchmarks/results/frontier-h200-2026-12-07/frontier/frontier.jsonl"


def test_the_figure_has_a_panel_for_every_case_of_the_run(tmp_path):
    cases = read_cases(RUN)
    cells = [cell for case in cases.values() for cell in case]
    panels = frontiers(results_frame(cells), every_size=True)
    measured = [label for label, case in cases.items() if any(cell.status == "ok" for cell in case)]
    assert len(panels) == len(measured) == 10  # Mistral-NeMo was left for lack of time: 11 cases, 10 measured

    assert {(f.head, f.tokens) for f in panels} >= {("4096×128256", 8192), ("4096×128256", 32768)}
    assert main([str(RUN), "-o", str(tmp_path / "frontier.png")]) == 0
    assert (tmp_path / "frontier.png").read_bytes().startswith(b"\x89PNG")


def test_a_missing_or_empty_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nothing.jsonl"), "-o", str(tmp_path / "f.png")]) == 2
    (tmp_path / "empty.jsonl").write_text('{"kind": "gemm"}\n')
    assert main([str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "f.png")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "is not a file" in errors[0] and "holds no measured cell" in errors[1]
    assert not (tmp_path / "f.png").exists()
