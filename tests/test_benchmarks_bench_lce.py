"""The benchmark script: arguments, the measurement loop on CPU, failure recording (bench_lce.py, measure.py)."""
import json

import pytest
import torch

from benchmarks import bench_lce
from benchmarks.impls import backend_for
from benchmarks.measure import measure_cell, time_calls
from benchmarks.protocol import ANCHOR_ROWS, Row, make_inputs
from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import Backend
from fusedce_profiler.instrument.records import CellSpec
from fusedce_profiler.instrument.reference import reference

TINY = Row(16, 8, 37)


def _fp32_reference(inputs):
    """The fp32 reference of a plain mean cross-entropy on ``inputs``."""
    return reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, LossOptions())


def test_defaults_are_the_anchor_rows_both_modes_all_impls_five_repeats():
    args = bench_lce.build_parser().parse_args(["--out", "x"])
    settings = bench_lce.settings_from_args(args)
    assert settings.rows == [row.shape for row in ANCHOR_ROWS]
    assert settings.modes == ["amp", "bf16"]
    assert settings.impls == ["torch", "torch_compile", "liger", "cce", "fusedce"]
    assert (settings.repeats, settings.device, settings.ignore_frac, settings.all_options) == (5, "cuda", 0.0, False)


@pytest.mark.parametrize("argv", [
    ["--out", "x", "--rows", "8192x768"], ["--out", "x", "--ignore-frac", "1.5"], ["--out", "x", "--repeats", "0"],
    ["--out", "x", "--impls", "apex"], ["--out", "x", "--modes", "fp8"], ["--rows", "8x8x8"],
])
def test_bad_arguments_exit_with_status_two(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_lce.build_parser().parse_args(argv)
    assert exc.value.code == 2


def test_all_options_turns_on_bias_label_smoothing_z_loss_and_softcap():
    args = bench_lce.build_parser().parse_args(["--out", "x", "--all-options", "--ignore-frac", "0.3"])
    spec = bench_lce.cell_spec(bench_lce.settings_from_args(args), "8192x768x32777", "amp", "fusedce")
    assert spec.mode == "amp-bf16" and spec.bias and spec.ignore_frac == 0.3
    assert (spec.label_smoothing, spec.z_loss, spec.softcap) == (0.1, 1e-4, 30.0)


def test_cpu_run_measures_torch_and_fusedce_and_skips_what_needs_cuda(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--device", "cpu", "--rows", TINY.shape, "--impls", "torch", "cce", "fusedce",
            "--repeats", "2", "--ignore-frac", "0.25", "--all-options"]
    assert bench_lce.main(argv) == 0
    (json_path,) = tmp_path.glob("cpu-*-ignore25-all-options.json")
    assert json_path.with_suffix(".md").exists()
    written = json.loads(json_path.read_text())
    assert written["environment"]["gpu"] == "cpu" and written["environment"]["torch"] == torch.__version__
    assert written["settings"]["ignore_frac"] == 0.25 and written["settings"]["all_options"] is True
    cells = written["cells"]
    assert [(c["spec"]["mode"], c["spec"]["backend"]) for c in cells] == [
        (mode, impl) for mode in ("amp-bf16", "bf16") for impl in ("torch", "cce", "fusedce")]
    for cell in cells:
        if cell["spec"]["backend"] == "cce":  # CUDA only: "not installed" here, else "runs on cuda only"
            assert cell["status"] == "skipped", cell
            assert "not installed" in cell["message"] or "cuda only" in cell["message"]
            continue
        assert cell["status"] == "ok", cell["message"]
        assert len(cell["times_ms"]) == 2 and cell["time_ms"] > 0
        assert cell["peak_step_bytes"] > 0 and cell["memory_source"] == "cpu-profiler"
        assert all(0 <= cell["parity"][key] < 0.05 for key in ("loss", "grad_hidden", "grad_weight", "grad_bias"))
    assert "fusedce" in capsys.readouterr().out
    # no silent overwrite; --check fails because memory was not measured on the CPU
    assert bench_lce.main(argv) == 2
    assert bench_lce.main(argv + ["--overwrite", "--check", "--impls", "fusedce"]) == 1


def test_cuda_run_without_cuda_is_refused(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert bench_lce.main(["--out", str(tmp_path), "--rows", TINY.shape]) == 2


def _spec(backend: str) -> CellSpec:
    return CellSpec(backend=backend, tokens=TINY.tokens, vocab=TINY.vocab, hidden=TINY.hidden, mode="bf16",
                    device="cpu")


class _Failing(Backend):
    """A back-end whose loss raises ``error``."""

    name = "boom"

    def __init__(self, error: Exception):
        self.error = error

    def make(self):
        def loss(hidden, weight, target, bias, options):
            raise self.error
        return loss


@pytest.mark.parametrize("error, status, requested", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."), "oom", 2 << 30),
    (RuntimeError("kernel exploded\nlong traceback"), "error", None),
])
def test_a_failing_implementation_is_recorded_and_the_run_goes_on(error, status, requested):
    inputs = make_inputs(TINY, "bf16", device="cpu")
    ref = _fp32_reference(inputs)
    cell = measure_cell(_Failing(error), _spec("boom"), inputs, ref, repeats=2)
    assert cell.status == status and cell.oom_requested_bytes == requested
    assert cell.time_ms is None and cell.parity.grad_hidden is None
    assert "\n" not in cell.message and cell.message
    assert inputs.hidden.grad is None and inputs.weight.grad is None
    follow_up = measure_cell(backend_for("torch"), _spec("torch"), inputs, ref, repeats=1)
    assert follow_up.status == "ok"


def test_time_calls_times_each_call_and_runs_the_setup_outside():
    calls = []
    times = time_calls(lambda: calls.append("call"), 3, device="cpu", before=lambda: calls.append("before"))
    assert len(times) == 3 and all(t >= 0 for t in times)
    assert calls == ["before", "call"] * 3
    with pytest.raises(ValueError, match="repeats"):
        time_calls(lambda: None, 0, device="cpu")
