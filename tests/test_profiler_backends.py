"""Back-end registry: names, discovery of optional packages, option support, parity on the CPU."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, active_options, get_backend, list_backends
from fusedce_profiler.grid.cell import MeasureSettings, measure_cell
from fusedce_profiler.instrument.records import CellSpec


def test_builtin_backends_are_the_documented_eight():
    assert set(BUILTIN_BACKENDS) == {"torch", "torch-compile", "torch-native", "fusedce", "fusedce-min",
                                     "fusedce-fast", "liger", "cce"}
    assert [info.name for info in list_backends()] == list(BUILTIN_BACKENDS)


def test_choosing_back_ends_and_recording_the_environment_import_no_optional_package(monkeypatch):
    """A third-party back-end's options import its package (seconds: liger loads dozens of Triton
    kernels); the default run's choice of back-ends and the environment record need versions only."""
    from fusedce_profile.defaults import installed_backends
    from fusedce_profiler.instrument.backends import installed_versions
    from fusedce_profiler.instrument.backends.third_party import CceBackend, LigerBackend
    from fusedce_profiler.instrument.environment import collect_environment

    def imports_the_package(self):
        raise AssertionError(f"{self.name}'s options were read")

    for cls in (LigerBackend, CceBackend):
        monkeypatch.setattr(cls, "options", property(imports_the_package))
    versions = installed_versions()
    assert list(versions) == list(BUILTIN_BACKENDS) and versions["torch"] == torch.__version__
    assert {"torch", "fusedce"} <= set(installed_backends("cuda"))
    assert "liger" not in installed_backends("cpu")
    assert collect_environment()["backends"]["torch"] == torch.__version__


def test_unknown_backend_name_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="torch-compile"):
        get_backend("tourch")


@pytest.mark.parametrize("bad", [":fn", "module:", "a:b:"])
def test_malformed_user_backend_is_rejected(bad):
    with pytest.raises(ValueError, match="package.module:callable"):
        get_backend(bad)


@pytest.mark.parametrize("name, module", [("liger", "liger_kernel"), ("cce", "cut_cross_entropy")])
def test_missing_optional_backend_is_listed_as_not_installed(monkeypatch, name, module):
    for mod in list(sys.modules):
        if mod == module or mod.startswith(module + "."):
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    info = next(i for i in list_backends() if i.name == name)
    assert not info.available
    assert info.version is None
    assert info.reason.startswith("not installed")
    assert "not installed" in get_backend(name).unsupported(CellSpec(name, 8, 16, 4, device="cuda"))


def test_missing_torch_native_is_reported_not_raised(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    info = get_backend("torch-native").info()
    assert not info.available and "linear_cross_entropy" in info.reason


def test_cuda_only_backends_skip_cpu_cells_with_a_reason(monkeypatch):
    # an importable stand-in, so the device check is what skips the cell whether or not
    # liger-kernel is installed here
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    spec = CellSpec("liger", 8, 16, 4, device="cpu")
    assert "cuda" in get_backend("liger").unsupported(spec)
    result = measure_cell(spec)
    assert result.status == "skipped" and "cuda" in result.message


def _needs_installed(backend: str) -> None:
    """Skip where this torch lacks the back-end (torch-native: F.linear_cross_entropy, torch ≥ 2.13)."""
    info = get_backend(backend).info()
    if not info.available:
        pytest.skip(info.reason)


@pytest.mark.parametrize("backend, option, fragment", [
    ("torch-native", {"z_loss": 1e-4}, "z_loss"),
    ("torch-native", {"softcap": 30.0}, "softcap"),
    ("torch-native", {"label_smoothing": 0.1}, "label_smoothing"),  # its chunked path would fall back
    ("torch-native", {"bias": True, "ignore_frac": 0.3, "reduction": "none"}, None),
    ("torch", {"softcap": 30.0}, None),
    ("fusedce", {"label_smoothing": 0.1, "bias": True}, None),
])
def test_option_support_is_checked_per_cell(backend, option, fragment):
    _needs_installed(backend)
    reason = get_backend(backend).unsupported(CellSpec(backend, 8, 16, 4, device="cpu", **option))
    if fragment is None:
        assert reason is None
    else:
        assert fragment in reason


def _loss_without_softcap(hidden, weight, target, bias=None, reduction="mean"):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return torch.nn.functional.cross_entropy(logits, target, reduction=reduction)


def test_user_backend_is_skipped_for_options_its_signature_lacks():
    name = f"{__name__}:_loss_without_softcap"
    backend = get_backend(name)
    assert backend.unsupported(CellSpec(name, 8, 16, 4, device="cpu", reduction="sum")) is None
    reason = backend.unsupported(CellSpec(name, 8, 16, 4, device="cpu", softcap=10.0))
    assert "softcap" in reason


def test_user_backend_that_cannot_be_imported_is_skipped():
    name = "no_such_module_xyz:loss"
    assert "cannot import" in get_backend(name).unsupported(CellSpec(name, 8, 16, 4, device="cpu"))


def test_loss_options_list_only_what_differs_from_plain_mean():
    assert active_options(LossOptions()) == set()
    assert active_options(LossOptions(reduction="sum", softcap=5.0)) == {"reduction=sum", "softcap"}


# Parity: every CPU back-end on a tiny cell, against the chunked fp32 reference.
# fp32 differs only by summation order; amp-bf16 by bf16 rounding of logits and gradients
# (ANCHORS: ~2-3e-3 for eager torch).
_FAST = MeasureSettings(warmup=1, repeats=1)


@pytest.mark.parametrize("backend", ["torch", "torch-native", "fusedce", "torch-compile"])
def test_cpu_backends_agree_with_the_fp32_reference(backend):
    _needs_installed(backend)
    tol = {"fp32": 1e-4, "amp-bf16": 2e-2}
    modes = ["fp32"] if backend == "torch-compile" else ["fp32", "amp-bf16"]  # compiling twice is slow
    for mode in modes:
        spec = CellSpec(backend, 48, 300, 32, mode=mode, device="cpu", bias=backend != "torch-compile",
                        ignore_frac=0.25)
        result = measure_cell(spec, _FAST)
        assert result.status == "ok", result.message
        parity = result.parity
        for name in ("loss", "grad_hidden", "grad_weight"):
            assert getattr(parity, name) < tol[mode], (mode, name, parity)
        if spec.bias:
            assert parity.grad_bias < tol[mode]
        assert result.memory_source == "cpu-profiler"
        assert result.peak_step_bytes >= result.floor_bytes  # the gradients alone reach the floor


def test_torch_backend_options_match_their_definitions():
    """z-loss adds z·lse² per valid row; soft-cap is c·tanh(logits/c) before the loss."""
    torch.manual_seed(0)
    h, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(10, 4, dtype=torch.float64)
    y = torch.tensor([1, 2, -100, 3, 4, 5])
    fn = get_backend("torch").make()
    logits = 3.0 * torch.tanh(h @ w.T / 3.0)
    valid = y != -100
    expected = (torch.nn.functional.cross_entropy(logits, y, reduction="none")
                + 0.01 * torch.logsumexp(logits, -1).square() * valid).sum() / valid.sum()
    got = fn(h, w, y, None, LossOptions(z_loss=0.01, softcap=3.0))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["torch", "fusedce", "fusedce-min", "fusedce-fast"])
def test_backends_without_a_warmup_on_the_cpu_measure_the_bytes_of_a_warm_step(name, monkeypatch):
    backend = get_backend(name)
    assert not backend.needs_warmup("cpu") and backend.needs_warmup("cuda")
    spec = CellSpec(backend=name, tokens=192, vocab=3000, hidden=64, mode="amp-bf16", device="cpu")
    first = measure_cell(spec, MeasureSettings(warmup=1, repeats=1))
    monkeypatch.setattr(type(backend), "needs_warmup", lambda self, device: True)
    warm = measure_cell(spec, MeasureSettings(warmup=1, repeats=1))
    assert (first.extra["warmup_steps"], warm.extra["warmup_steps"]) == (0, 1)
    assert first.status == warm.status == "ok"
    assert (first.peak_forward_bytes, first.peak_backward_bytes, first.peak_step_bytes) == (
        warm.peak_forward_bytes, warm.peak_backward_bytes, warm.peak_step_bytes)
    assert first.parity == warm.parity


def test_compiled_and_unproven_backends_keep_their_warmup_on_the_cpu():
    assert get_backend("torch-compile").needs_warmup("cpu")
    assert get_backend("torch-native").needs_warmup("cpu")


def test_a_cell_stores_its_seconds_by_phase_and_they_add_up_to_its_wall_time():
    result = measure_cell(CellSpec("torch", 16, 64, 8, mode="fp32", device="cpu"), MeasureSettings(warmup=1, repeats=2))
    phases = result.extra["phase_s"]
    assert list(phases) == ["inputs", "warmup", "metered", "parity", "timed", "settle"]
    assert all(seconds >= 0 for seconds in phases.values())
    assert sum(phases.values()) == pytest.approx(result.extra["wall_s"], abs=0.01)


def test_a_worker_cell_job_sets_its_survivors_aside_from_the_cyclic_collector():
    import gc

    from fusedce_profiler.grid.cell import run_cell_job

    frozen = gc.get_freeze_count()
    try:
        row = run_cell_job({"spec": CellSpec("torch", 16, 64, 8, mode="fp32", device="cpu").__dict__,
                            "settings": {"warmup": 0, "repeats": 1}})
        assert row["status"] == "ok"
        assert gc.get_freeze_count() > frozen  # later settles walk only what later cells make
    finally:
        gc.unfreeze()
