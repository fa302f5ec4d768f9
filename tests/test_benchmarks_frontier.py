"""benchmarks/frontier.py on the CPU: the records it writes, the time budget, bad arguments."""
import json

import pytest

from benchmarks import frontier
from benchmarks.protocol import Row
from benchmarks.results import load_run

CASES = (frontier.Case(Row(48, 16, 97), "bf16", "tiny"),
         frontier.Case(Row(40, 8, 61), "amp", "tiny, bias", bias=True))
IMPLS = ("fusedce", "fusedce_fast", "fusedce_min", "fusedce_precompute", "fusedce_fast_per_chunk", "torch")


def _lines(out):
    return [json.loads(line) for line in (out / "frontier.jsonl").read_text().splitlines()]


def test_every_case_and_implementation_is_recorded_with_its_floor_multiple(tmp_path):
    run = frontier.run_frontier(tmp_path, device="cpu", cases=CASES, impls=IMPLS, repeats=1, budget_s=600,
                                log=lambda line: None)
    lines = _lines(tmp_path)
    cells = [line for line in lines if line["kind"] == "cell"]
    assert [line["kind"] for line in lines].count("gemm") == 2
    goals = [line for line in lines if line["kind"] == "goals"]  # one verdict per case, after its cells
    assert [g["case"] for g in goals] == [case.label for case in CASES]
    assert set(goals[0]["goals"]) == {"1", "2", "3", "4", "5"} and "fusedce" in goals[0]["dominated_by"]
    assert [(c["case"], c["spec"]["backend"]) for c in cells] == [(case.label, name) for case in CASES
                                                                  for name in IMPLS]
    by_key = {(c["case"], c["spec"]["backend"]): c for c in cells}
    assert by_key[("tiny, bias", "fusedce_fast_per_chunk")]["status"] == "skipped"  # fp32 weight
    for key, cell in by_key.items():
        if cell["status"] == "ok":
            assert cell["x_floor"] == pytest.approx(cell["peak_step_bytes"] / cell["floor_bytes"])
            assert cell["parity"]["grad_weight"] < 1e-2, key
    assert sum(c["status"] == "ok" for c in cells) == len(cells) - 1
    assert len(load_run(tmp_path / "frontier.json").cells) == len(run.cells)
    assert json.loads((tmp_path / "environment.json").read_text())["torch"]
    assert "fusedce_min" in (tmp_path / "frontier.md").read_text()


def test_cases_after_the_budget_are_recorded_as_out_of_time(tmp_path):
    frontier.run_frontier(tmp_path, device="cpu", cases=CASES, impls=("fusedce",), repeats=1, budget_s=1e-9,
                          log=lambda line: None)
    cells = [line for line in _lines(tmp_path) if line["kind"] == "cell"]
    assert len(cells) == 2 and all(c["status"] == "skipped" and c["message"] == "out of time" for c in cells)


def test_an_existing_result_is_not_overwritten(tmp_path):
    (tmp_path / "frontier.jsonl").write_text("")
    assert frontier.main(["--out", str(tmp_path), "--dry"]) == 2


@pytest.mark.parametrize("argv", [["--repeats", "3"], ["--budget-s", "0"], ["--impls", "fusedce_nope"],
                                  ["--seed", str(2 ** 70)], ["--seed", "-1"]])
def test_bad_arguments_exit_2_in_one_line(tmp_path, capsys, argv):
    assert frontier.main(["--out", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("frontier: --") and "\n" not in err


def test_impls_and_mode_select_the_cells(tmp_path):
    assert frontier.main(["--out", str(tmp_path), "--dry", "--repeats", "1", "--mode", "bf16",
                          "--impls", "fusedce_min_per_chunk", "fusedce"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "frontier.jsonl").read_text().splitlines()]
    cells = [row for row in rows if row["kind"] == "cell"]
    assert {c["spec"]["backend"] for c in cells} == {"fusedce_min_per_chunk", "fusedce"}
    assert {c["spec"]["mode"] for c in cells} == {"bf16"}


def test_seed_draws_other_inputs_and_is_recorded_in_every_cell(tmp_path):
    """Another seed, other inputs: the errors differ from seed 0's, and each cell and the goals name it."""
    errors = {}
    for seed in (0, 5):
        out = tmp_path / f"seed{seed}"
        assert frontier.main(["--out", str(out), "--dry", "--repeats", "1", "--cases", "tiny", "--seed", str(seed),
                              "--impls", "fusedce", "torch"]) == 0
        cells = [row for row in _lines(out) if row["kind"] == "cell"]
        assert {c["spec"]["seed"] for c in cells} == {seed} and len(cells) == 2
        goals = [row for row in _lines(out) if row["kind"] == "goals"]
        assert "fusedce" in goals[0]["dominated_by"]  # the case's cells were found by their keys
        assert load_run(out / "frontier.json").settings.seed == seed
        errors[seed] = [c["parity"]["grad_hidden"] for c in cells]
    assert errors[0] != errors[5]
