"""The fp32 chunked reference and the error norms (benchmarks/reference.py, benchmarks/measure.py)."""
import math

import pytest
import torch

from benchmarks.impls import eager_loss
from benchmarks.measure import relative_error
from benchmarks.protocol import IGNORE_INDEX, Inputs, Row, make_inputs
from benchmarks.reference import reference_loss_and_grads

OPTIONS = dict(ignore_index=IGNORE_INDEX, label_smoothing=0.1, z_loss=1e-3, softcap=3.0)


def _float64_autograd(inputs: Inputs, **options):
    """An independent oracle: F.cross_entropy (label smoothing) + logsumexp z-loss in float64."""
    leaves = [t.detach().double().requires_grad_() for t in inputs.leaves()]
    hidden, weight, bias = leaves if len(leaves) == 3 else (*leaves, None)
    loss = eager_loss(hidden, weight, inputs.target, bias, **options)
    loss.backward()
    return loss, hidden.grad, weight.grad, bias.grad if bias is not None else None


@pytest.mark.parametrize("chunk_elements", [37 * 5, 1 << 28])  # five rows a chunk, one chunk
def test_reference_matches_float64_autograd_with_every_option_and_ignored_targets(chunk_elements):
    inputs = make_inputs(Row(23, 16, 37), "amp-bf16", device="cpu", ignore_frac=0.3, bias=True, seed=1)
    ref = reference_loss_and_grads(inputs, chunk_elements=chunk_elements, **OPTIONS)
    loss, grad_h, grad_w, grad_b = _float64_autograd(inputs, **OPTIONS)
    assert ref.loss.dtype == ref.grad_hidden.dtype == ref.grad_weight.dtype == torch.float32
    assert float(ref.loss) == pytest.approx(float(loss.detach()), rel=1e-6)
    torch.testing.assert_close(ref.grad_hidden.double(), grad_h, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ref.grad_weight.double(), grad_w, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ref.grad_bias.double(), grad_b, rtol=1e-5, atol=1e-7)


def test_reference_gives_zero_gradient_rows_for_ignored_tokens():
    inputs = make_inputs(Row(20, 8, 11), "bf16", device="cpu", ignore_frac=0.5)
    ref = reference_loss_and_grads(inputs)
    ignored = inputs.target == IGNORE_INDEX
    assert torch.all(ref.grad_hidden[ignored] == 0)
    assert torch.all(ref.grad_hidden[~ignored].abs().sum(dim=1) > 0)


def test_reference_does_not_touch_the_inputs_gradients():
    inputs = make_inputs(Row(6, 4, 5), "amp-bf16", device="cpu")
    reference_loss_and_grads(inputs)
    assert inputs.hidden.grad is None and inputs.weight.grad is None


def test_reference_rejects_a_non_positive_chunk():
    inputs = make_inputs(Row(2, 2, 2), "bf16", device="cpu")
    with pytest.raises(ValueError, match="chunk_elements"):
        reference_loss_and_grads(inputs, chunk_elements=0)


def test_relative_error_is_the_ratio_of_norms():
    reference = torch.tensor([3.0, 4.0])
    assert relative_error(torch.tensor([3.0, 4.0]), reference) == 0.0
    assert relative_error(torch.tensor([0.0, 4.0]), reference) == pytest.approx(3 / 5)
    assert relative_error(torch.tensor([3.0, 4.0], dtype=torch.bfloat16), reference) == 0.0
    assert relative_error(None, reference) is None and relative_error(reference, None) is None


def test_relative_error_of_a_zero_reference_is_the_absolute_norm():
    assert relative_error(torch.tensor([3.0, 4.0]), torch.zeros(2)) == pytest.approx(5.0)


def test_relative_error_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        relative_error(torch.zeros(3), torch.zeros(4))


def test_relative_error_accumulates_across_chunks(monkeypatch):
    import benchmarks.measure as measure

    monkeypatch.setattr(measure, "_COMPARE_CHUNK", 3)
    reference = torch.arange(1.0, 11.0)
    value = reference + torch.linspace(-1, 1, 10)
    expected = math.sqrt(float(((value - reference) ** 2).sum()) / float((reference ** 2).sum()))
    assert relative_error(value, reference) == pytest.approx(expected)
