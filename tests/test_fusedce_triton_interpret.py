"""The Triton path (``impl="triton"``) against the float64 reference, in Triton's interpreter.

Without CUDA, ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` and the real kernels run on
CPU tensors (slowly): shapes stay small (N ≤ 37, V ≤ 131, H ≤ 40) but ragged, so every
masked tail of every block is exercised. On a CUDA machine the same tests run the compiled
kernels on the GPU.
"""
import functools
import importlib.util
import os

import pytest
import torch

import fusedce
from reference import (
    OPTION_CASES,
    REDUCTIONS,
    case_for_vocab,
    check_against_reference,
    make_inputs,
    reference_linear_cross_entropy,
    relative_error,
    run_fused,
    seed_for,
)

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed: the Triton path cannot run", allow_module_level=True)

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

DEVICE = "cuda" if HAS_CUDA else "cpu"
FP32_RTOL = 1e-5
LOW_PRECISION_RTOL = 1e-2


def triton_path(hidden, weight, target, bias=None, **kwargs):
    return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="triton", **kwargs)


def check(n, h, v, case_name, reduction, *, seed, **kwargs):
    fn = functools.partial(triton_path, **kwargs)
    case = case_for_vocab(v, OPTION_CASES[case_name])
    return check_against_reference(fn, n, h, v, case, reduction, rtol=FP32_RTOL, seed=seed, device=DEVICE)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case_name", list(OPTION_CASES))
def test_every_option_matches_reference(case_name, reduction):
    check(37, 40, 131, case_name, reduction, seed=seed_for("triton-option", case_name, reduction))


@pytest.mark.parametrize(
    "n,h,v",
    [(1, 8, 2), (37, 40, 131), (16, 16, 128), (5, 3, 1), (23, 33, 67)],
    ids=["single-token", "odd-N_prime-V", "aligned", "V-1_H-3", "odd-everything"],
)
def test_ragged_shapes_match_reference(n, h, v):
    check(n, h, v, "mixed", "mean", seed=seed_for("triton-shape", n, h, v))


@pytest.mark.parametrize(
    "chunk_size,vocab_chunk_size,reduction",
    [(7, None, "mean"), (None, 32, "none"), (16, 48, "sum")],
    ids=["rows-7-mean", "cols-32-none", "rows-16_cols-48-sum"],
)
def test_many_chunks_match_reference(chunk_size, vocab_chunk_size, reduction):
    """Several row and vocabulary chunks (none dividing N = 37 or V = 131) with every option."""
    check(
        37, 24, 131, "mixed", reduction, seed=seed_for("triton-chunks", chunk_size, vocab_chunk_size, reduction),
        chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_rows_longer_than_one_kernel_block_match_reference(reduction):
    """V = 4099 in one vocabulary chunk: each row spans several kernel blocks, the last one partial."""
    check(5, 8, 4099, "mixed", reduction, seed=seed_for("triton-long-rows", reduction))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_3d_inputs_match_reference(reduction):
    fn = functools.partial(triton_path, chunk_size=8)
    got = check_against_reference(
        fn, 2 * 9, 16, 29, OPTION_CASES["mixed"], reduction, rtol=FP32_RTOL,
        seed=seed_for("triton-3d", reduction), batch_shape=(2, 9), device=DEVICE,
    )
    assert got.grad_hidden.shape == (2, 9, 16)


@pytest.mark.parametrize("case_name", ["plain", "mixed"])
@pytest.mark.parametrize(
    "hidden_dtype,weight_dtype,autocast",
    [
        (torch.bfloat16, torch.bfloat16, False),
        (torch.float16, torch.float16, False),
        (torch.float32, torch.float32, True),
        (torch.bfloat16, torch.float32, True),
    ],
    ids=["bf16", "fp16", "autocast-fp32-hidden", "autocast-bf16-hidden"],
)
def test_low_precision_inputs_return_grads_in_each_inputs_dtype(hidden_dtype, weight_dtype, autocast, case_name):
    """bf16/fp16 operands (pure, or bf16 autocast over fp32 master weights) against float64."""
    case = OPTION_CASES[case_name]
    hidden, weight, target, bias = make_inputs(
        37, 40, 131, seed=seed_for("triton-low", hidden_dtype, weight_dtype, autocast, case_name),
        with_bias=case.with_bias, ignore_fraction=case.ignore_fraction, device=DEVICE,
    )
    hidden = hidden.detach().to(hidden_dtype).requires_grad_(True)
    weight = weight.detach().to(weight_dtype).requires_grad_(True)
    if bias is not None:
        bias = bias.detach().to(weight_dtype).requires_grad_(True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        got = run_fused(triton_path, hidden, weight, target, bias, **case.options.as_kwargs())
    assert got.grad_hidden.dtype == hidden_dtype and got.grad_weight.dtype == weight_dtype
    assert got.grad_bias is None or got.grad_bias.dtype == weight_dtype
    want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        if getattr(want, field) is not None:
            err = relative_error(getattr(got, field), getattr(want, field))
            assert err <= LOW_PRECISION_RTOL, f"{field}: relative error {err:.3g}"


def test_bf16_autocast_rows_longer_than_one_kernel_block():
    """The logit gradients are written as bf16 over the fp32 logits they replace: with several
    blocks per row, each block must write only over logits already read."""
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        5, 8, 4099, seed=seed_for("triton-long-rows-bf16"), with_bias=True,
        ignore_fraction=case.ignore_fraction, device=DEVICE,
    )
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        got = run_fused(triton_path, hidden, weight, target, bias, **case.options.as_kwargs())
    want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        err = relative_error(getattr(got, field), getattr(want, field))
        assert err <= LOW_PRECISION_RTOL, f"{field}: relative error {err:.3g}"


def test_triton_and_torch_paths_agree():
    """Both implementations of the same semantics, on the same inputs, to fp32 rounding."""
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        29, 24, 97, seed=seed_for("triton-vs-torch"), with_bias=True, ignore_fraction=0.3, device=DEVICE
    )
    kwargs = case.options.as_kwargs()
    tri = run_fused(triton_path, hidden, weight, target, bias, **kwargs)
    tor = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="torch", **kwargs)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        err = relative_error(getattr(tri, field), getattr(tor, field))
        assert err <= 2 * FP32_RTOL, f"{field}: triton vs torch relative difference {err:.3g}"
