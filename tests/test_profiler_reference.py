"""The chunked fp32 reference (profiler/reference.py), shared by the profiler and the benchmark."""
import pytest
import torch

from fusedce.options import IGNORE_INDEX, LossOptions
from fusedce_profiler.grid.inputs import make_inputs
from fusedce_profiler.instrument.records import CellSpec
from fusedce_profiler.instrument.reference import reference as fp32_reference
from reference import LossOptions as SpecOptions
from reference import reference_linear_cross_entropy

EVERY_OPTION = dict(label_smoothing=0.1, z_loss=1e-3, softcap=3.0)


def _inputs(tokens=23, vocab=37, hidden=16, *, mode="amp-bf16", bias=True, ignore_frac=0.3, seed=1):
    return make_inputs(CellSpec("torch", tokens, vocab, hidden, mode=mode, device="cpu", bias=bias,
                                ignore_frac=ignore_frac, seed=seed))


def _fp32_reference(inputs, options, **kwargs):
    return fp32_reference(inputs.hidden, inputs.weight, inputs.target, inputs.bias, options, **kwargs)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [5, None])  # five rows a chunk, or one chunk
def test_reference_matches_the_float64_specification_with_every_option(reduction, chunk):
    inputs = _inputs()
    assert (inputs.target == IGNORE_INDEX).any()
    options = LossOptions(reduction=reduction, **EVERY_OPTION)
    ref = _fp32_reference(inputs, options, chunk=chunk)
    want = reference_linear_cross_entropy(inputs.hidden, inputs.weight, inputs.target, inputs.bias,
                                          SpecOptions(reduction=reduction, **EVERY_OPTION),
                                          upstream=torch.ones(23) if reduction == "none" else None)
    assert ref.loss.dtype == ref.grad_hidden.dtype == ref.grad_weight.dtype == ref.grad_bias.dtype == torch.float32
    torch.testing.assert_close(ref.loss.double(), want.loss, rtol=1e-5, atol=1e-6)
    for name in ("grad_hidden", "grad_weight", "grad_bias"):
        torch.testing.assert_close(getattr(ref, name).double(), getattr(want, name), rtol=1e-5, atol=1e-7)


def test_reference_gives_zero_gradient_rows_for_ignored_tokens():
    inputs = _inputs(20, 11, 8, mode="bf16", bias=False, ignore_frac=0.5)
    ref = _fp32_reference(inputs, LossOptions())
    ignored = inputs.target == IGNORE_INDEX
    assert ignored.any() and (~ignored).any()
    assert torch.all(ref.grad_hidden[ignored] == 0)
    assert torch.all(ref.grad_hidden[~ignored].abs().sum(dim=1) > 0)


def test_reference_does_not_touch_the_inputs_or_their_gradients():
    inputs = _inputs(6, 5, 4, bias=False, ignore_frac=0.0)
    weight_before = inputs.weight.detach().clone()
    _fp32_reference(inputs, LossOptions(), chunk=2)
    assert inputs.hidden.grad is None and inputs.weight.grad is None
    assert torch.equal(inputs.weight, weight_before)


def test_reference_runs_in_true_fp32_and_restores_the_tf32_flags():
    inputs = _inputs(8, 7, 4, mode="fp32", ignore_frac=0.0)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a caller's autocast must not leak in
            ref = _fp32_reference(inputs, LossOptions())
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    plain = _fp32_reference(inputs, LossOptions())
    assert ref.grad_weight.dtype == torch.float32
    torch.testing.assert_close(ref.grad_weight, plain.grad_weight, rtol=0, atol=0)


def test_reference_rejects_a_non_positive_chunk():
    inputs = _inputs(2, 2, 2, ignore_frac=0.0)
    with pytest.raises(ValueError, match="chunk"):
        _fp32_reference(inputs, LossOptions(), chunk=0)


def test_reference_of_a_mean_over_no_valid_target_is_an_error():
    inputs = _inputs(4, 5, 3, ignore_frac=1.0)
    with pytest.raises(ValueError, match="ignore_index"):
        _fp32_reference(inputs, LossOptions())
    assert _fp32_reference(inputs, LossOptions(reduction="sum")).loss.item() == 0.0
