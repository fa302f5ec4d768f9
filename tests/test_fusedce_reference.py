"""The float64 reference itself agrees with torch's own ops, so the other tests can trust it."""
import pytest
import torch
import torch.nn.functional as F

from reference import (
    OPTION_CASES,
    LossOptions,
    assert_matches_reference,
    chunked_reference_linear_cross_entropy,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    seed_for,
)


def torch_composition(hidden, weight, target, bias, options: LossOptions) -> torch.Tensor:
    """The specification spelled with F.linear / F.cross_entropy / logsumexp (float64 inputs)."""
    logits = F.linear(hidden, weight, bias)
    if options.softcap is not None:
        logits = options.softcap * torch.tanh(logits / options.softcap)
    flat, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    ce = F.cross_entropy(
        flat, flat_target, ignore_index=options.ignore_index, reduction="none",
        label_smoothing=options.label_smoothing,
    )
    valid = flat_target != options.ignore_index
    per_token = ce + options.z_loss * torch.logsumexp(flat, -1).square() * valid
    if options.reduction == "none":
        return per_token.reshape(target.shape)
    if options.reduction == "sum":
        return per_token.sum()
    return per_token.sum() / valid.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "options",
    [
        LossOptions(),
        LossOptions(label_smoothing=0.2),
        LossOptions(z_loss=1e-3, softcap=4.0),
        LossOptions(label_smoothing=0.1, z_loss=1e-3, softcap=4.0, ignore_index=3),
    ],
    ids=["plain", "label_smoothing", "z_loss_softcap", "mixed"],
)
def test_reference_matches_torch_composition(options, reduction):
    options = LossOptions(**{**options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(
        23, 12, 17, seed=seed_for("reference", options), with_bias=True, ignore_fraction=0.3,
        ignore_index=options.ignore_index, dtype=torch.float64,
    )
    got = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream=1.0)
    want = torch_composition(hidden, weight, target, bias, options)
    torch.testing.assert_close(got.loss, want.detach(), rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(want.sum(), (hidden, weight, bias))
    for name, g, w in zip(("hidden", "weight", "bias"), (got.grad_hidden, got.grad_weight, got.grad_bias), grads):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=lambda m: f"grad_{name}: {m}")


def test_reference_mean_of_all_ignored_is_nan_with_zero_gradients_like_cross_entropy():
    hidden, weight, target, _ = make_inputs(5, 4, 3, seed=seed_for("reference-ignored"), ignore_fraction=1.0)
    got = reference_linear_cross_entropy(hidden, weight, target)
    assert torch.isnan(got.loss)
    assert torch.count_nonzero(got.grad_hidden) == 0 and torch.count_nonzero(got.grad_weight) == 0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_fraction", [0.3, 1.0], ids=["some-ignored", "all-ignored"])
def test_chunked_reference_equals_the_reference(reduction, ignore_fraction):
    """The GPU tests' row-chunked float64 reference agrees with the one-shot reference."""
    options = LossOptions(**{**OPTION_CASES["mixed"].options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(
        37, 12, 17, seed=seed_for("chunked-reference", reduction, ignore_fraction), with_bias=True,
        ignore_fraction=ignore_fraction, batch_shape=(37,),
    )
    upstream = make_upstream(target, reduction, seed_for("chunked-reference-up", reduction))
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    got = chunked_reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream, rows_per_chunk=8)
    assert_matches_reference(got, want, rtol=1e-12)
