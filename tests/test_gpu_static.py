"""The GPU-only tests cannot rot unnoticed: a CPU pass resolves every name they use (tests/gpu_static.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_static import check_gpu_tests

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

TESTS = Path(__file__).resolve().parent


def test_every_gpu_test_uses_only_attributes_and_keywords_that_exist():
    files = sorted(TESTS.glob("test_*.py"))
    assert check_gpu_tests(files) == []


def _planted(tmp_path: Path, old: str, new: str) -> Path:
    source = (TESTS / "test_profiler_memory_model.py").read_text()
    assert old in source
    copy = tmp_path / "test_planted_gpu.py"
    copy.write_text(source.replace(old, new, 1))
    return copy


def test_a_missing_attribute_of_a_result_is_reported(tmp_path):
    copy = _planted(tmp_path, 'assert result.snapshot_path.endswith(".pickle")',
                    'assert result.timeline_png.endswith(".png")')
    (problem,) = check_gpu_tests([copy])
    assert f"{copy}:" in problem and "CellResult, which has no attribute 'timeline_png'" in problem


def test_a_keyword_a_function_does_not_take_is_reported(tmp_path):
    copy = _planted(tmp_path, "MeasureSettings(warmup=1, repeats=1,", "MeasureSettings(warmup=1, repeat=1,")
    problems = check_gpu_tests([copy])
    assert any("MeasureSettings() takes no keyword 'repeat'" in p for p in problems), problems


def test_a_missing_module_attribute_is_reported(tmp_path):
    copy = _planted(tmp_path, "Timeline.from_dict(store.read_json(", "Timeline.from_dict(store.read_json_file(")
    assert any("module fusedce_profiler.instrument.store has no attribute 'read_json_file'" in p
               for p in check_gpu_tests([copy]))


def test_an_attribute_reached_through_an_annotated_field_is_checked(tmp_path):
    """Only ``name.attr`` of a typed local was checked: ``cell.parity.grad_hiddn`` (a renamed field of the
    field's own class) went unnoticed until a GPU ran it."""
    source = (TESTS / "test_benchmarks_impls.py").read_text()
    old = "cell.parity.grad_hidden < 0.05"
    assert old in source
    copy = tmp_path / "test_planted_gpu.py"
    copy.write_text(source.replace(old, "cell.parity.grad_hiddn < 0.05", 1))
    assert any("cell.parity is a Parity, which has no attribute 'grad_hiddn'" in p for p in check_gpu_tests([copy]))


def test_a_positional_argument_too_many_is_reported(tmp_path):
    """Only keyword names were checked against a signature: a call with one argument too many (a
    ``TypeError`` on the GPU) passed."""
    on_cuda = 'spec = CellSpec("torch", 4096, 32777, 768, mode=mode, device="cuda")\n    result = measure_cell(spec, _ONE_STEP'
    copy = _planted(tmp_path, on_cuda + ")", on_cuda + ", 5)")
    assert any("measure_cell(): too many positional arguments" in p for p in check_gpu_tests([copy]))
