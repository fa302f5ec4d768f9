"""A run never writes a folder its own ``report`` refuses: what a run sets out to write is bounded by
the readers' limits before it starts (:mod:`fusedce_profiler.instrument.capacity`)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile import run_grid
from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument import capacity, confined, store
from fusedce_profiler.instrument.records import CellSpec

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

TINY = ["--device", "cpu", "--hidden", "32", "--backend", "torch"]


def _one_line(result) -> str:
    (line,) = result.output.strip().splitlines()
    return line


def test_a_grid_of_more_cells_than_a_folder_holds_is_refused_before_any_cell(tmp_path):
    """100,000 cells wrote a 30 MB plan.json over its 16 MiB limit (and results.jsonl past its lines)."""
    vocab = ",".join(str(v) for v in range(8, 1008))
    tokens = ",".join(str(n) for n in range(1, 101))
    result = CliRunner().invoke(app, ["grid", *TINY, "--vocab", vocab, "--tokens", tokens, "--out", str(tmp_path / "g")])
    assert result.exit_code == 2
    assert _one_line(result) == (f"error: the grid has 100,000 cells, more than the {capacity.MAX_CELLS:,} a run "
                                 "folder holds (one line each of results.jsonl): split it into several runs")
    assert not (tmp_path / "g").exists()
    with pytest.raises(UsageError, match="the grid has 100,000 cells"):
        run_grid(device="cpu", hidden=[32], backend=["torch"], vocab=list(range(8, 1008)), tokens=list(range(1, 101)),
                 out=tmp_path / "g")


def test_the_largest_grid_allowed_writes_a_plan_and_rows_its_reader_reads():
    """The writer's bound sits inside the reader's: a plan of MAX_CELLS cells of long names, rows of
    the most repeats a row may hold."""
    cell = CellSpec(backend="a" * 200, tokens=2**31 - 1, vocab=2**31 - 1, hidden=2**31 - 1, batch=2**31 - 1,
                    seq=2**31 - 1, ignore_frac=0.123456789012345, label_smoothing=0.123456789012345,
                    z_loss=1.2345678901234567e-05, softcap=12.345678901234567, seed=2**63 - 1)
    per_cell = len(store.dumps({"cells": [cell.__dict__]}, indent=1, sort_keys=True))
    assert per_cell * capacity.MAX_CELLS <= confined.size_limit(store.PLAN_FILE)
    assert capacity.MAX_CELLS <= confined.MAX_LINES
    most = (confined.MAX_LINE_BYTES - capacity.ROW_BYTES) // capacity.NUMBER_BYTES
    assert capacity.grid_problem(1, most) is None and capacity.grid_problem(1, most + 1)
    assert len(json.dumps([1.2345678901234567e-05] * most)) <= most * capacity.NUMBER_BYTES


def test_repeats_that_make_a_row_longer_than_a_line_may_be_are_refused(tmp_path):
    result = CliRunner().invoke(app, ["grid", *TINY, "--vocab", "256", "--tokens", "8", "--repeats", "200000",
                                      "--out", str(tmp_path / "g")])
    assert result.exit_code == 2 and "over the 4,194,304-byte limit of a line of results.jsonl" in _one_line(result)


def test_parity_of_more_steps_than_parity_json_holds_is_refused_before_training(tmp_path):
    result = CliRunner().invoke(app, ["parity", "--device", "cpu", "--steps", "1000000", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2
    assert "--steps 1000000 for 3 training runs would make parity.json over its" in _one_line(result)
    assert not (tmp_path / "p").exists()


def test_a_recorder_asked_for_more_steps_than_a_folder_holds_says_so(tmp_path):
    from torch import nn

    from fusedce_profiler.instrument.recording.recorder import StepRecorder

    with pytest.raises(ValueError, match="more than the 20,000 a folder holds"):
        StepRecorder(nn.Linear(2, 2), tmp_path / "r", steps=range(capacity.MAX_RECORDED_STEPS + 1))
