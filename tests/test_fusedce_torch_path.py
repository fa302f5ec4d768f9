"""The PyTorch path (``impl="torch"``) against the float64 reference: values, gradients, chunking.

fp32 inputs are held to 1e-5 relative error in norm (and 1e-4 element-wise, with a floor
scaled to the largest entry); bf16 runs to 1e-2 in norm. Every case draws fresh inputs from
its own seed.
"""
import functools

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import fusedce
from reference import (
    OPTION_CASES,
    REDUCTIONS,
    assert_matches_reference,
    case_for_vocab,
    check_against_reference,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    relative_error,
    run_fused,
    seed_for,
)

FP32_RTOL = 1e-5
BF16_RTOL = 1e-2

torch_path = functools.partial(fusedce.linear_cross_entropy, impl="torch")


@pytest.mark.parametrize(
    "n,h,v",
    [(37, 40, 131), (1, 8, 2), (64, 16, 127), (129, 72, 1009), (11, 24, 1), (50, 5, 3)],
    ids=["odd-N_prime-V", "single-token", "H-16_prime-V", "larger-ragged", "V-1", "tiny-H"],
)
def test_ragged_shapes_match_reference(n, h, v):
    case = case_for_vocab(v, OPTION_CASES["mixed"])
    check_against_reference(torch_path, n, h, v, case, "mean", rtol=FP32_RTOL, seed=seed_for("shape", n, h, v))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case_name", list(OPTION_CASES))
def test_every_option_matches_reference(case_name, reduction):
    check_against_reference(
        torch_path, 37, 40, 131, OPTION_CASES[case_name], reduction,
        rtol=FP32_RTOL, seed=seed_for("option", case_name, reduction),
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("chunk_size", [1, 7, 16, 45, 1000])
def test_chunk_size_does_not_change_the_result(chunk_size, reduction):
    """N = 45: chunks of 1 (one per token), 7 and 16 (last chunk partial), 45 and 1000 (one chunk)."""
    check_against_reference(
        torch_path, 45, 24, 97, OPTION_CASES["mixed"], reduction,
        rtol=FP32_RTOL, seed=seed_for("chunk", chunk_size, reduction), chunk_size=chunk_size,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("chunk_size,vocab_chunk_size", [(None, 1), (None, 10), (8, 32), (45, 96)])
def test_vocabulary_chunks_do_not_change_the_result(chunk_size, vocab_chunk_size, reduction):
    """V = 97 in chunks of 1, 10, 32 (last one partial) and 96 (last one a single entry)."""
    check_against_reference(
        torch_path, 45, 24, 97, OPTION_CASES["mixed"], reduction, rtol=FP32_RTOL,
        seed=seed_for("vocab-chunk", chunk_size, vocab_chunk_size, reduction),
        chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_3d_inputs_match_reference(reduction):
    got = check_against_reference(
        torch_path, 3 * 13, 20, 61, OPTION_CASES["mixed"], reduction,
        rtol=FP32_RTOL, seed=seed_for("3d", reduction), batch_shape=(3, 13), chunk_size=8,
    )
    assert got.grad_hidden.shape == (3, 13, 20)
    if reduction == "none":
        assert got.loss.shape == (3, 13)


def test_fp32_loss_and_grads_keep_input_dtypes():
    hidden, weight, target, bias = make_inputs(9, 8, 11, seed=seed_for("dtypes"), with_bias=True)
    got = run_fused(torch_path, hidden, weight, target, bias)
    assert got.loss.dtype == torch.float32
    assert got.grad_hidden.dtype == got.grad_weight.dtype == got.grad_bias.dtype == torch.float32


@pytest.mark.parametrize("case_name", ["plain", "mixed"])
def test_pure_bf16_inputs_return_bf16_grads_close_to_reference(case_name):
    case = OPTION_CASES[case_name]
    hidden, weight, target, bias = make_inputs(
        61, 48, 257, seed=seed_for("bf16", case_name), with_bias=case.with_bias,
        ignore_fraction=case.ignore_fraction, dtype=torch.bfloat16,
    )
    got = run_fused(torch_path, hidden, weight, target, bias, **case.options.as_kwargs())
    for grad in (got.grad_hidden, got.grad_weight, got.grad_bias):
        assert grad is None or grad.dtype == torch.bfloat16
    want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options)
    assert_matches_reference(got, want, rtol=BF16_RTOL, norm_only=True)


@pytest.mark.parametrize("hidden_dtype", [torch.float32, torch.bfloat16], ids=["fp32-hidden", "bf16-hidden"])
@pytest.mark.parametrize("case_name", ["plain", "mixed"])
def test_cpu_bf16_autocast_returns_grads_in_each_inputs_dtype(case_name, hidden_dtype):
    """fp32 master weight (and bias) → fp32 grads; the hidden grad follows the hidden dtype."""
    case = OPTION_CASES[case_name]
    hidden, weight, target, bias = make_inputs(
        61, 48, 257, seed=seed_for("autocast", case_name, hidden_dtype), with_bias=case.with_bias,
        ignore_fraction=case.ignore_fraction,
    )
    hidden = hidden.detach().to(hidden_dtype).requires_grad_(True)
    upstream = make_upstream(target, "mean", seed_for("autocast-upstream", case_name))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run_fused(torch_path, hidden, weight, target, bias, upstream, **case.options.as_kwargs())
    assert got.grad_hidden.dtype == hidden_dtype
    assert got.grad_weight.dtype == torch.float32
    assert got.grad_bias is None or got.grad_bias.dtype == torch.float32
    want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options, upstream)
    assert_matches_reference(got, want, rtol=BF16_RTOL, norm_only=True)


def test_cpu_bf16_autocast_runs_the_matmuls_in_bf16():
    """Under autocast the result carries bf16 rounding: far from fp32-exact, yet within bf16 tolerance."""
    hidden, weight, target, _ = make_inputs(61, 48, 257, seed=seed_for("autocast-precision"))
    want = reference_linear_cross_entropy(hidden, weight, target)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run_fused(torch_path, hidden, weight, target)
    err = relative_error(got.grad_weight, want.grad_weight)
    assert 1e-4 < err < BF16_RTOL, f"grad_weight relative error {err:.3g}: not a bf16 computation"


class LargestTensorMode(TorchDispatchMode):
    """Records the largest numel of any tensor an aten op returns, and how many ops ran."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.largest_op = None
        self.op_count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.op_count += 1
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.largest_op = t.numel(), str(func)
        return out


@pytest.mark.parametrize("case_name,reduction", [("plain", "mean"), ("mixed", "mean"), ("mixed", "none")])
def test_chunked_path_never_allocates_a_full_n_by_v_tensor(case_name, reduction):
    """N·V = 300·997 dwarfs every legitimate tensor (chunk·V, V·H, N·H): any N×V op output shows."""
    n, h, v, chunk = 300, 16, 997, 64
    case = OPTION_CASES[case_name]
    hidden, weight, target, bias = make_inputs(
        n, h, v, seed=seed_for("no-nxv", case_name, reduction), with_bias=case.with_bias,
        ignore_fraction=case.ignore_fraction,
    )
    options = {**case.options.as_kwargs(), "reduction": reduction}
    upstream = make_upstream(target, reduction, seed_for("no-nxv-up", case_name, reduction))
    with LargestTensorMode() as mode:
        run_fused(torch_path, hidden, weight, target, bias, upstream, chunk_size=chunk, **options)
    assert mode.largest < n * v, f"{mode.largest_op} returned {mode.largest} elements (N·V = {n * v})"
    bound = max(chunk * v, v * h, n * h)
    assert mode.largest <= bound, (
        f"{mode.largest_op} returned {mode.largest} elements, more than one chunk of logits "
        f"(chunk_size·V = {chunk * v}) or an input-sized tensor"
    )


def test_default_chunking_avoids_full_logits_once_they_are_large():
    """No chunk options: 4096 × 8192 fp32 logits (128 MiB) are never allocated whole."""
    n, h, v = 4096, 16, 8192
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("default-chunking"))
    with LargestTensorMode() as mode:
        torch_path(hidden, weight, target).backward()
    assert mode.largest < n * v, f"{mode.largest_op} returned {mode.largest} elements (N·V = {n * v})"


def test_memory_budget_bounds_the_logits_block():
    """A budget of a quarter of the N×V fp32 logits: every tensor stays below N·V, results unchanged."""
    n, h, v = 300, 16, 997
    budget = n * v * 4 // 4
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        n, h, v, seed=seed_for("budget"), with_bias=True, ignore_fraction=case.ignore_fraction
    )
    with LargestTensorMode() as mode:
        got = run_fused(torch_path, hidden, weight, target, bias, memory_budget=budget, **case.options.as_kwargs())
    assert mode.largest < n * v, f"{mode.largest_op} returned {mode.largest} elements (N·V = {n * v})"
    want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options)
    assert_matches_reference(got, want, rtol=FP32_RTOL)


def test_op_count_does_not_grow_with_tokens_inside_one_chunk():
    """No Python loop per token: 10× more tokens in a single chunk dispatch the same number of ops."""
    counts = []
    for n in (40, 400):
        hidden, weight, target, bias = make_inputs(
            n, 16, 53, seed=seed_for("ops", n), with_bias=True, ignore_fraction=0.3
        )
        with LargestTensorMode() as mode:
            run_fused(
                torch_path, hidden, weight, target, bias, chunk_size=n, **OPTION_CASES["mixed"].options.as_kwargs()
            )
        counts.append(mode.op_count)
    assert counts[1] <= counts[0] * 1.5, f"ops dispatched for N=40 vs N=400: {counts}"


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_many_chunks_with_all_options_match_reference_at_a_larger_shape(reduction):
    """Chunk boundaries (N = 257, chunk 32: 8 full chunks and one of 1 token) with every option."""
    check_against_reference(
        torch_path, 257, 40, 503, OPTION_CASES["mixed"], reduction,
        rtol=FP32_RTOL, seed=seed_for("larger-chunked", reduction), chunk_size=32,
    )


def test_gradients_only_for_inputs_that_require_them():
    """Frozen weight (e.g. tied embeddings in eval) or detached hidden: only the asked grads exist."""
    case = OPTION_CASES["mixed"]
    for frozen in ("hidden", "weight", "bias"):
        hidden, weight, target, bias = make_inputs(
            21, 12, 29, seed=seed_for("partial-grad", frozen), with_bias=True, ignore_fraction=0.3
        )
        {"hidden": hidden, "weight": weight, "bias": bias}[frozen].requires_grad_(False)
        got = run_fused(torch_path, hidden, weight, target, bias, **case.options.as_kwargs())
        want = reference_linear_cross_entropy(hidden, weight, target, bias, case.options)
        assert_matches_reference(got, want, rtol=FP32_RTOL)


def test_no_grad_call_returns_the_value():
    hidden, weight, target, _ = make_inputs(17, 8, 13, seed=seed_for("no-grad"))
    with torch.no_grad():
        loss = torch_path(hidden, weight, target)
    assert not loss.requires_grad
    want = reference_linear_cross_entropy(hidden.detach(), weight.detach(), target)
    torch.testing.assert_close(loss.double(), want.loss, rtol=FP32_RTOL, atol=0)
