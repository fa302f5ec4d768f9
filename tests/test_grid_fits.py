"""A grid whose cells cannot fit is refused before any cell runs: the loss's inputs, weight and
gradients of each cell are counted (the memory model's :func:`least_bytes`), and the first cell that
needs more than the device has is one line naming where its sizes came from, exit 2, no folder."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile.errors import UsageError
from fusedce_profiler.grid.memory_model import floor_bytes, inputs_bytes, least_bytes
from fusedce_profiler.instrument.records import CellSpec

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults


def _config(tmp_path, hidden: int, vocab: int):
    path = tmp_path / "absurd.json"
    path.write_text(json.dumps({"hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": 1,
                                "num_attention_heads": 1, "ffn_factor": 1}))
    return path


@pytest.mark.parametrize("hidden, vocab, named", [
    (10**9, 32000, "hidden_size 1000000000, vocab_size 32000 at 8 tokens (amp-bf16)"),
    (64, 10**11, "hidden_size 64, vocab_size 100000000000 at 8 tokens (amp-bf16)"),
])
def test_a_config_too_large_for_the_machine_is_refused_naming_its_entries(tmp_path, hidden, vocab, named):
    config, out = _config(tmp_path, hidden, vocab), tmp_path / "never"
    result = CliRunner().invoke(app, ["grid", "--device", "cpu", "--config", str(config), "--tokens", "8",
                                      "--backend", "torch", "--out", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: --config {config}: {named}: the loss's inputs, weight and gradients alone need ")
    assert "more than this machine's available memory" in line and "Traceback" not in result.output
    assert not out.exists()


def test_the_default_run_with_such_a_config_is_refused_too(tmp_path):
    config, out = _config(tmp_path, 10**9, 32000), tmp_path / "never"
    result = CliRunner().invoke(app, ["--device", "cpu", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"error: --config {config}: hidden_size 1000000000, vocab_size 32000 at " in result.output
    assert not out.exists()


def test_the_first_cell_past_the_memory_is_named_and_nothing_runs(tmp_path, monkeypatch):
    import fusedce_profile.checks as checks
    from fusedce_profile.grid import run_grid
    from fusedce_profiler.grid.spec import GridSpec

    fits = least_bytes(CellSpec(backend="torch", tokens=64, vocab=256, hidden=32, mode="fp32", device="cpu"))
    monkeypatch.setattr(checks, "available_memory_bytes", lambda device: fits)
    out = tmp_path / "never"
    with pytest.raises(UsageError, match=r"^--hidden 32, --vocab 256 at 128 tokens \(fp32\): the loss's inputs, "
                                         r"weight and gradients alone need "):
        run_grid(tokens=[8, 64, 128, 4096], hidden=[32], vocab=[256], backend=["torch"], mode=["fp32"], device="cpu",
                 out=out)
    assert not out.exists()
    spec = GridSpec(tokens=(8, 64), hidden=(32,), vocab=(256,), backends=("torch",), modes=("fp32",), device="cpu")
    checks.check_grid_fits(spec, {"hidden": "--hidden", "vocab": "--vocab"})  # what fits is not refused


@pytest.mark.parametrize("mode, bias", [("amp-bf16", False), ("fp32", True), ("bf16", True)])
def test_the_counted_inputs_are_the_bytes_a_cell_allocates(mode, bias):
    from fusedce_profiler.grid.inputs import make_inputs

    spec = CellSpec(backend="torch", tokens=24, vocab=40, hidden=16, mode=mode, device="cpu", bias=bias)
    inputs = make_inputs(spec)
    tensors = [inputs.hidden, inputs.weight, inputs.target] + ([inputs.bias] if bias else [])
    assert inputs_bytes(spec) == sum(t.numel() * t.element_size() for t in tensors)
    assert least_bytes(spec) == inputs_bytes(spec) + floor_bytes(spec)


def test_the_cpu_has_what_meminfo_says_is_available():
    import os

    from fusedce_profile.checks import available_memory_bytes

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available_memory_bytes("cpu") <= physical
