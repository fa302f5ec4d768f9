"""The benchmark's implementations are the profiler's back-ends (benchmarks/impls.py, measure.py).

liger-kernel and cut-cross-entropy run on CUDA only; on the CPU their adapters are checked
against stand-in modules with the signatures of the versions in ``shared/ANCHORS.md``
(liger-kernel 0.8.5, cut-cross-entropy 25.1.1), which record how they are called.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from benchmarks.impls import BACKEND_NAMES, IMPLS, backend_for, installed_version
from benchmarks.measure import measure_cell
from fusedce_profiler.instrument.backends import options_of
from benchmarks.protocol import Row, make_inputs
from fusedce.options import LossOptions
from fusedce_profiler.instrument.records import CellSpec
from fusedce_profiler.instrument.reference import reference

def loss_step(backend, spec):
    """The back-end's loss for the cell's options, called on a cell's inputs."""
    fn = backend.make()
    return lambda x: fn(x.hidden, x.weight, x.target, x.bias, options_of(spec))


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
TINY = Row(16, 8, 37)
EVERYTHING = dict(bias=True, ignore_frac=0.25, label_smoothing=0.1, z_loss=1e-4, softcap=30.0)


def _spec(impl: str, device: str = "cpu", row: Row = TINY, mode: str = "bf16", **options) -> CellSpec:
    return CellSpec(backend=impl, tokens=row.tokens, vocab=row.vocab, hidden=row.hidden, mode=mode,
                    device=device, **options)


def _inputs(spec: CellSpec):
    row = Row(spec.tokens, spec.hidden, spec.vocab)
    inputs = make_inputs(row, spec.mode, device=spec.device, ignore_frac=spec.ignore_frac, bias=spec.bias)
    ref = reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options_of(spec))
    return inputs, ref


def test_each_benchmark_name_is_one_profiler_backend():
    assert IMPLS == ("torch", "torch_compile", "liger", "cce", "fusedce")
    assert {impl: backend_for(impl).name for impl in IMPLS} == {
        "torch": "torch", "torch_compile": "torch-compile", "liger": "liger", "cce": "cce", "fusedce": "fusedce"}
    assert BACKEND_NAMES["torch_compile"] == "torch-compile"


def test_impl_names_in_the_committed_results_are_all_mapped():
    files = sorted(RESULTS.glob("*.json"))
    assert files, f"no committed results in {RESULTS}"
    for path in files:
        raw = json.loads(path.read_text())
        names = set(raw["settings"]["impls"]) | {cell["spec"]["backend"] for cell in raw["cells"]}
        assert names <= set(IMPLS), (path.name, names - set(IMPLS))


def test_unknown_impl_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="torch_compile"):
        backend_for("torch-compile")


def test_only_mean_reduction_is_measured():
    spec = _spec("torch", reduction="sum")
    inputs, ref = _inputs(_spec("torch"))
    with pytest.raises(ValueError, match="reduction"):
        measure_cell(backend_for("torch"), spec, inputs, ref)


def test_torch_compile_starts_from_a_fresh_dynamo_cache_in_every_cell(monkeypatch):
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    for _ in range(2):
        loss_step(backend_for("torch_compile"), _spec("torch_compile"))
    assert len(resets) == 2


def test_torch_compile_and_fusedce_cells_with_every_option_match_the_reference():
    spec = _spec("torch_compile", **EVERYTHING)
    inputs, ref = _inputs(spec)
    for impl in ("torch_compile", "fusedce"):
        cell = measure_cell(backend_for(impl), _spec(impl, **EVERYTHING), inputs, ref, repeats=1)
        assert cell.status == "ok", cell.message
        assert cell.backend_version and cell.spec.backend == impl
        for name in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
            assert getattr(cell.parity, name) < 0.05, (impl, name, cell.parity)


@pytest.mark.parametrize("impl, module", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
def test_a_missing_package_skips_its_cells_and_has_no_version(monkeypatch, impl, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    assert installed_version(backend_for(impl)) == ""
    spec = _spec(impl, device="cuda")
    inputs, ref = _inputs(_spec(impl))
    cell = measure_cell(backend_for(impl), spec, inputs, ref)
    assert cell.status == "skipped" and "not installed" in cell.message
    assert cell.backend_version == "" and cell.time_ms is None


class _FakeLigerLoss(torch.nn.Module):
    """liger-kernel 0.8.5's constructor signature; records its arguments and its calls."""

    made: list[dict] = []
    calls: list[tuple] = []

    def __init__(self, ce_weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
                 reduction="mean", softcap=None, return_z_loss=False, accum_dtype=None):
        super().__init__()
        self.made.append(dict(ignore_index=ignore_index, lse_square_scale=lse_square_scale,
                              label_smoothing=label_smoothing, reduction=reduction, softcap=softcap,
                              return_z_loss=return_z_loss))

    def forward(self, lin_weight, _input, target, bias=None):
        self.calls.append((lin_weight, _input, target, bias))
        return _input.float().sum() * 0


@pytest.fixture
def fake_liger(monkeypatch):
    package, transformers = types.ModuleType("liger_kernel"), types.ModuleType("liger_kernel.transformers")
    transformers.LigerFusedLinearCrossEntropyLoss = _FakeLigerLoss
    package.transformers = transformers
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", transformers)
    monkeypatch.setattr(_FakeLigerLoss, "made", [])
    monkeypatch.setattr(_FakeLigerLoss, "calls", [])
    return _FakeLigerLoss


def test_liger_is_called_weight_first_with_its_z_loss_as_lse_square_scale(fake_liger):
    spec = _spec("liger", device="cuda", **EVERYTHING)
    assert backend_for("liger").unsupported(spec) is None
    inputs, _ = _inputs(_spec("liger", **EVERYTHING))
    loss_step(backend_for("liger"), spec)(inputs)
    assert fake_liger.made == [dict(ignore_index=-100, lse_square_scale=1e-4, label_smoothing=0.1,
                                    reduction="mean", softcap=30.0, return_z_loss=False)]
    ((weight, hidden, target, bias),) = fake_liger.calls
    assert weight is inputs.weight and hidden is inputs.hidden
    assert target is inputs.target and bias is inputs.bias


def test_liger_cells_on_the_cpu_are_skipped_as_needing_cuda(fake_liger):
    inputs, ref = _inputs(_spec("liger"))
    cell = measure_cell(backend_for("liger"), _spec("liger"), inputs, ref)
    assert cell.status == "skipped" and "cuda" in cell.message
    assert not fake_liger.calls


_CCE_CALLS: list[tuple] = []


def _fake_cce(e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False, filter_eps="high",
              impl="cce"):
    """cut-cross-entropy 25.1.1's ``linear_cross_entropy`` signature (no bias, no label smoothing)."""
    _CCE_CALLS.append((e, c, targets, dict(ignore_index=ignore_index, softcap=softcap, reduction=reduction,
                                           shift=shift, filter_eps=filter_eps, impl=impl)))
    return e.float().sum() * 0


@pytest.fixture
def fake_cce(monkeypatch):
    module = types.ModuleType("cut_cross_entropy")
    module.linear_cross_entropy = _fake_cce
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", module)
    _CCE_CALLS.clear()
    return _CCE_CALLS


def test_cce_is_called_hidden_first_with_its_default_gradient_filtering(fake_cce):
    spec = _spec("cce", device="cuda", ignore_frac=0.25, softcap=30.0)
    assert backend_for("cce").unsupported(spec) is None
    inputs, _ = _inputs(_spec("cce", ignore_frac=0.25, softcap=30.0))
    loss_step(backend_for("cce"), spec)(inputs)
    ((hidden, weight, target, kwargs),) = fake_cce
    assert hidden is inputs.hidden and weight is inputs.weight and target is inputs.target
    assert kwargs == dict(ignore_index=-100, softcap=30.0, reduction="mean", shift=False, filter_eps="high",
                          impl="cce")


@pytest.mark.parametrize("options, named", [
    (dict(bias=True), "bias"), (dict(label_smoothing=0.1), "label_smoothing"), (dict(z_loss=1e-4), "z_loss"),
])
def test_cce_cells_with_options_it_lacks_are_skipped_with_the_reason(fake_cce, options, named):
    spec = _spec("cce", device="cuda", **options)
    inputs, ref = _inputs(_spec("cce", **options))
    cell = measure_cell(backend_for("cce"), spec, inputs, ref)
    assert cell.status == "skipped" and named in cell.message, cell.message
    assert not fake_cce


# On a CUDA machine with liger-kernel and cut-cross-entropy installed: the real packages
# through the benchmark's path, against the fp32 reference (ANCHORS: their gradient errors
# are ≤ 0.005 (liger) and ≤ 0.021 (cce, gradient filtering) at the anchor rows).
GPU_ROW = Row(1024, 256, 4099)  # V not a multiple of any block size


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl, module", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
@pytest.mark.parametrize("mode", ["amp-bf16", "bf16"])
def test_installed_liger_and_cce_match_the_reference_on_cuda(impl, module, mode):
    pytest.importorskip(module)
    spec = _spec(impl, device="cuda", row=GPU_ROW, mode=mode, ignore_frac=0.25)
    inputs, ref = _inputs(spec)
    cell = measure_cell(backend_for(impl), spec, inputs, ref, repeats=1)
    assert cell.status == "ok", cell.message
    assert cell.parity.loss < 0.01 and cell.parity.grad_hidden < 0.05 and cell.parity.grad_weight < 0.05, cell.parity


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_installed_liger_honours_every_option_on_cuda():
    pytest.importorskip("liger_kernel")
    spec = _spec("liger", device="cuda", row=GPU_ROW, **EVERYTHING)
    inputs, ref = _inputs(spec)
    cell = measure_cell(backend_for("liger"), spec, inputs, ref, repeats=1)
    assert cell.status == "ok", cell.message
    for name in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert getattr(cell.parity, name) < 0.05, (name, cell.parity)
