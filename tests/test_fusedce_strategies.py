"""The two strategies of the chunked loss: gradients recomputed in backward, or precomputed
in forward (``fusedce.chunking``). Both against the float64 reference on both row-op
implementations (PyTorch, and the Triton kernels under the interpreter), the planner's
choice, and the precompute strategy's own contract (in-place scaling, one backward).
"""
import functools

import pytest
import torch

import fusedce
from fusedce.chunked import scale_gradients_
from fusedce.chunking import MIN_PRECOMPUTE_ROWS, plan_chunks
from fusedce.memory_model import predict_peak_bytes
from fusedce.op import triton_available
from reference import (OPTION_CASES, LossOptions, check_against_reference, make_inputs,
                       reference_linear_cross_entropy, relative_error, run_fused, seed_for)

FP32_RTOL = 1e-5
IMPLS = ["torch"] + (["triton"] if triton_available(torch.device("cpu")) else [])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("strategy", ["recompute", "precompute"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case_name", list(OPTION_CASES))
def test_both_strategies_match_reference_for_every_option(case_name, reduction, strategy, impl):
    """Several row chunks (chunk_size=16 of N=37) so grad_weight is summed across chunks."""
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl, strategy=strategy, chunk_size=16)
    check_against_reference(fn, 37, 24, 131, OPTION_CASES[case_name], reduction, rtol=FP32_RTOL,
                            seed=seed_for("strategy", case_name, reduction, strategy, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("chunk_size", [1, 10])
def test_precompute_with_a_bf16_weight_sums_grad_weight_over_row_chunks_in_fp32(chunk_size, impl):
    """bf16 weight, several row chunks: grad_weight goes through an fp32 accumulator and is
    rounded once, so it is as close to the float64 reference as a single-chunk run (summing
    40 per-token bf16 roundings instead would be several times further off)."""
    hidden, weight, target, _ = make_inputs(40, 32, 97, seed=seed_for("bf16-acc", chunk_size, impl),
                                            dtype=torch.bfloat16)
    want = reference_linear_cross_entropy(hidden, weight, target, None, LossOptions(), 1.0)
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl, strategy="precompute")
    one_chunk = run_fused(fn, hidden, weight, target)
    chunked = run_fused(fn, hidden, weight, target, chunk_size=chunk_size)
    assert chunked.grad_weight.dtype == torch.bfloat16
    one_error = relative_error(one_chunk.grad_weight, want.grad_weight)
    assert relative_error(chunked.grad_weight, want.grad_weight) <= 1.25 * one_error + 1e-4
    torch.testing.assert_close(chunked.loss, one_chunk.loss, rtol=1e-6, atol=0)


def test_precompute_scales_by_the_real_upstream_gradient_in_fp32():
    """A non-unit upstream gradient (e.g. loss / accumulation steps) multiplies the saved
    gradients in fp32: the bf16 result is the once-rounded product, not a product with a
    bf16-rounded factor."""
    grad = torch.randn(5000, 8).to(torch.bfloat16)
    factor = torch.tensor(1.0 / 3.0)
    expected = (grad.float() * factor).to(torch.bfloat16)
    scale_gradients_([grad], factor, rows_per_step=777)
    assert torch.equal(grad, expected)


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["hidden-only", "weight-only"])
def test_precompute_computes_only_the_gradients_autograd_asks_for(needs):
    hidden, weight, target, _ = make_inputs(21, 16, 53, seed=seed_for("needs", needs))
    hidden.requires_grad_(needs[0])
    weight.requires_grad_(needs[1])
    fused = run_fused(functools.partial(fusedce.linear_cross_entropy, strategy="precompute"), hidden, weight,
                      target, upstream=0.5)
    full = run_fused(functools.partial(fusedce.linear_cross_entropy, strategy="recompute"),
                     hidden.detach().requires_grad_(), weight.detach().requires_grad_(), target, upstream=0.5)
    assert (fused.grad_hidden is None) != needs[0] and (fused.grad_weight is None) != needs[1]
    got, want = (fused.grad_hidden, full.grad_hidden) if needs[0] else (fused.grad_weight, full.grad_weight)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_precompute_refuses_a_second_backward_through_the_same_graph():
    hidden, weight, target, _ = make_inputs(9, 8, 17, seed=seed_for("twice"))
    loss = fusedce.linear_cross_entropy(hidden, weight, target, strategy="precompute")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="strategy='recompute'"):
        loss.backward()


def test_gradient_accumulation_over_two_calls_adds_up():
    hidden, weight, target, _ = make_inputs(30, 8, 19, seed=seed_for("accumulate"))
    for _ in range(2):
        fusedce.linear_cross_entropy(hidden, weight, target, strategy="precompute").backward()
    twice = weight.grad.clone()
    weight.grad = None
    fusedce.linear_cross_entropy(hidden, weight, target, strategy="recompute").backward()
    torch.testing.assert_close(twice, 2 * weight.grad, rtol=1e-6, atol=1e-9)


def test_precompute_without_autograd_returns_the_loss():
    hidden, weight, target, _ = make_inputs(12, 8, 29, seed=seed_for("no-grad"))
    with torch.no_grad():
        forced = fusedce.linear_cross_entropy(hidden, weight, target, strategy="precompute")
    plain = fusedce.linear_cross_entropy(hidden.detach(), weight.detach(), target, strategy="recompute")
    torch.testing.assert_close(forced, plain, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(reduction="none"), "reduction='mean' or 'sum'"),
    (dict(vocab_chunk_size=8), "vocab_chunk_size"),
    (dict(strategy="fast"), "strategy must be one of"),
])
def test_bad_strategy_requests_name_the_argument(kwargs, message):
    hidden, weight, target, _ = make_inputs(6, 8, 17, seed=seed_for("bad-strategy"))
    kwargs = {"strategy": "precompute", **kwargs}
    with pytest.raises(ValueError, match=message):
        fusedce.linear_cross_entropy(hidden, weight, target, **kwargs)


def test_precompute_refuses_float16_compute():
    with pytest.raises(ValueError, match="float16"):
        plan_chunks(8, 4, 16, hidden_dtype=torch.float16, weight_dtype=torch.float16,
                    compute_dtype=torch.float16, strategy="precompute", scalar_loss=True, needs_grad=True)


def _auto(n, h, v, weight_dtype=torch.float32, compute_dtype=torch.bfloat16, **kwargs):
    kwargs = {"scalar_loss": True, "needs_grad": True, **kwargs}
    return plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=weight_dtype,
                       compute_dtype=compute_dtype, strategy="auto", **kwargs)


def test_auto_precomputes_the_users_head_in_mixed_precision():
    """8192×768×32777, fp32 weight: the bf16 weight copy (48 MiB) and a few hundred rows of
    fp32 logits fit the default budget."""
    plan = _auto(8192, 768, 32777)
    assert plan.strategy == "precompute" and plan.cols == 32777
    assert MIN_PRECOMPUTE_ROWS <= plan.rows < 8192 and plan.rows % 64 == 0
    predicted = predict_peak_bytes(8192, 768, 32777, hidden_dtype=torch.bfloat16, weight_dtype=torch.float32,
                                   compute_dtype=torch.bfloat16)
    floor = 8192 * 768 * 2 + 32777 * 768 * 4
    assert predicted.plan == plan and predicted.step <= 1.1 * floor + 128 * (1 << 20)


@pytest.mark.parametrize("n,h,v,weight_dtype,kwargs", [
    (8192, 4096, 128256, torch.float32, {}),        # the bf16 weight copy alone exceeds the budget
    (8192, 4096, 128256, torch.bfloat16, {}),       # the fp32 grad_weight accumulator does
    (8192, 768, 32777, torch.float32, {"scalar_loss": False}),   # reduction='none'
    (8192, 768, 32777, torch.float32, {"needs_grad": False}),    # evaluation
    (8192, 768, 32777, torch.float32, {"vocab_chunk_size": 4096}),
], ids=["llama-amp", "llama-bf16", "reduction-none", "no-grad", "vocab-chunks"])
def test_auto_recomputes_where_precompute_does_not_fit_or_apply(n, h, v, weight_dtype, kwargs):
    assert _auto(n, h, v, weight_dtype=weight_dtype, **kwargs).strategy == "recompute"


def test_auto_recomputes_for_float16_compute():
    plan = _auto(512, 64, 1000, weight_dtype=torch.float16, compute_dtype=torch.float16)
    assert plan.strategy == "recompute"


@pytest.mark.parametrize("splits,k", [(1, 300), (3, 300), (4, 1000), (5, 193)])
def test_split_k_product_equals_the_plain_product(splits, k):
    """The slicing of split-K (64-aligned slices plus a leftover GEMM) on fp32 operands."""
    from fusedce.matmul import split_k_matmul_into

    gen = torch.Generator().manual_seed(splits * 1000 + k)
    a = torch.randn(7, 2 * k, generator=gen)[:, :k]  # a padded row stride, as the logits block has
    b = torch.randn(k, 5, generator=gen)
    out = torch.empty(7, 5)
    partials = torch.empty(splits, 7, 5) if splits > 1 else None
    split_k_matmul_into(out, a, b, partials)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-4)  # fp32 sums in another order
