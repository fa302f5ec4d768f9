"""Bad input raises ValueError/TypeError (IndexError for out-of-range targets) naming the argument.

Each case is checked on the PyTorch path and, under ``TRITON_INTERPRET=1`` (CI, no CUDA), on
the Triton path too, so validation cannot live in only one of them.
"""
import importlib.util
import os

import pytest
import torch

import fusedce

IMPLS = [
    "torch",
    pytest.param(
        "triton",
        marks=[
            pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
            pytest.mark.skipif(
                os.environ.get("TRITON_INTERPRET") != "1",
                reason="Triton runs CPU tensors only under TRITON_INTERPRET=1 (CUDA inputs: test_fusedce_gpu.py)",
            ),
        ],
    ),
]

N, H, V = 6, 8, 11


def good_inputs():
    """Valid inputs: hidden (N, H) fp32, weight (V, H) fp32, target (N,) int64, bias (V,) fp32."""
    gen = torch.Generator().manual_seed(1234)
    hidden = torch.randn(N, H, generator=gen, requires_grad=True)
    weight = torch.randn(V, H, generator=gen, requires_grad=True)
    target = torch.randint(0, V, (N,), generator=gen)
    bias = torch.randn(V, generator=gen, requires_grad=True)
    return hidden, weight, target, bias


def call(impl, hidden=None, weight=None, target=None, bias=None, **options):
    """Call linear_cross_entropy with good inputs where an argument is not given."""
    good_hidden, good_weight, good_target, good_bias = good_inputs()
    return fusedce.linear_cross_entropy(
        good_hidden if hidden is None else hidden,
        good_weight if weight is None else weight,
        good_target if target is None else target,
        good_bias if bias is None else bias,
        impl=impl,
        **options,
    )


def test_good_inputs_are_accepted():
    """The baseline every case below perturbs is itself valid."""
    assert torch.isfinite(call("torch"))


@pytest.mark.parametrize("impl", IMPLS)
def test_hidden_size_mismatch_names_hidden_or_weight(impl):
    with pytest.raises((ValueError, TypeError), match=r"hidden|weight"):
        call(impl, weight=torch.randn(V, H + 1))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad_shape", [(N + 1,), (N, 1), (1, N)], ids=["longer", "extra-dim", "transposed"])
def test_target_shape_mismatch_names_target(impl, bad_shape):
    with pytest.raises((ValueError, TypeError), match="target"):
        call(impl, target=torch.zeros(bad_shape, dtype=torch.long))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=["float", "bool"])
def test_non_integer_target_names_target(impl, dtype):
    with pytest.raises((ValueError, TypeError), match="target"):
        call(impl, target=torch.zeros(N, dtype=dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad_value", [V, V + 7, -1, -101], ids=["V", "beyond-V", "minus-one", "not-ignore-index"])
def test_out_of_range_target_raises_index_error_naming_target(impl, bad_value):
    target = torch.randint(0, V, (N,))
    target[N // 2] = bad_value
    with pytest.raises(IndexError, match="target"):
        call(impl, target=target)


@pytest.mark.parametrize("impl", IMPLS)
def test_custom_ignore_index_does_not_excuse_the_default_one(impl):
    """With ignore_index=-1, a -100 target is out of range."""
    target = torch.randint(0, V, (N,))
    target[0] = -100
    with pytest.raises(IndexError, match="target"):
        call(impl, target=target, ignore_index=-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "bad_shape", [(V + 1,), (V - 1,), (1, V), (N, V)], ids=["longer", "shorter", "2d", "per-token"]
)
def test_bias_shape_mismatch_names_bias(impl, bad_shape):
    with pytest.raises((ValueError, TypeError), match="bias"):
        call(impl, bias=torch.randn(bad_shape))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("reduction", ["avg", "MEAN", "", None])
def test_unknown_reduction_names_reduction(impl, reduction):
    with pytest.raises((ValueError, TypeError), match="reduction"):
        call(impl, reduction=reduction)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_label_smoothing_outside_unit_interval_names_label_smoothing(impl, value):
    with pytest.raises((ValueError, TypeError), match="label_smoothing"):
        call(impl, label_smoothing=value)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("value", [0.0, -30.0])
def test_non_positive_softcap_names_softcap(impl, value):
    with pytest.raises((ValueError, TypeError), match="softcap"):
        call(impl, softcap=value)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.bool])
def test_non_floating_hidden_names_hidden(impl, dtype):
    with pytest.raises((ValueError, TypeError), match="hidden"):
        call(impl, hidden=torch.ones(N, H, dtype=dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(V * H,), (1, V, H), ()], ids=["1d", "3d", "0d"])
def test_weight_not_2d_names_weight(impl, shape):
    weight = torch.randn(V * H).reshape(shape) if shape else torch.tensor(1.0)
    with pytest.raises((ValueError, TypeError), match="weight"):
        call(impl, weight=weight)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("moved", ["hidden", "weight", "target", "bias"])
def test_tensors_on_different_devices_name_the_argument(impl, moved):
    """One input on the meta device, the others on the CPU: the error names the odd one (or the device)."""
    hidden, weight, target, bias = good_inputs()
    inputs = {"hidden": hidden.detach(), "weight": weight.detach(), "target": target, "bias": bias.detach()}
    inputs[moved] = inputs[moved].to("meta")
    with pytest.raises((ValueError, TypeError), match=rf"{moved}|device"):
        fusedce.linear_cross_entropy(
            inputs["hidden"], inputs["weight"], inputs["target"], inputs["bias"], impl=impl
        )


@pytest.mark.parametrize("impl", ["cuda", "", "fused", None])
def test_unknown_impl_names_impl(impl):
    with pytest.raises((ValueError, TypeError), match="impl"):
        call(impl)


@pytest.mark.parametrize(
    "options,name",
    [({"reduction": "avg"}, "reduction"), ({"label_smoothing": 2.0}, "label_smoothing"),
     ({"softcap": 0.0}, "softcap"), ({"impl": "fused"}, "impl")],
    ids=["reduction", "label_smoothing", "softcap", "impl"],
)
def test_module_validates_its_options_like_the_function(options, name):
    """At construction or at the latest on the first call."""
    hidden, weight, target, bias = good_inputs()
    with pytest.raises((ValueError, TypeError), match=name):
        fusedce.LinearCrossEntropyLoss(**options)(hidden, weight, target, bias)
