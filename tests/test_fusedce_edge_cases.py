"""Edge cases behave like ``F.cross_entropy`` on the full logits, on every implementation.

Covers: all targets ignored, N = 0, V = 1, inputs with more than one batch dimension,
non-contiguous inputs, very large logits, the module API, ``impl="auto"`` and determinism.
The Triton path runs on CUDA tensors when there is a GPU, else on CPU tensors under
``TRITON_INTERPRET=1``; shapes stay tiny for the interpreter.
"""
import functools
import importlib.util
import inspect

import pytest
import torch

import fusedce
from fusedce.options import LossOptions as FusedOptions
from reference import (
    OPTION_CASES,
    REDUCTIONS,
    SINGLE_CLASS_CASE,
    LossAndGrads,
    LossOptions,
    OptionCase,
    assert_matches_reference,
    check_against_reference,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    run_fused,
    seed_for,
)

FP32_RTOL = 1e-5
MIXED = OPTION_CASES["mixed"]

IMPLS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
    ),
]


def device_for(impl: str) -> str:
    """Where the inputs of ``impl`` live: Triton takes CUDA tensors when there is a GPU."""
    return "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"


def with_reduction(options: LossOptions, reduction: str) -> LossOptions:
    return LossOptions(**{**options.as_kwargs(), "reduction": reduction})


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_all_targets_ignored_gives_nan_mean_zero_sum_and_zero_grads(impl, reduction):
    """As F.cross_entropy: mean → nan (0/0), sum → 0, none → zeros; every gradient is exactly 0."""
    options = with_reduction(MIXED.options, reduction)
    hidden, weight, target, bias = make_inputs(
        13, 8, 17, seed=seed_for("all-ignored", impl, reduction), with_bias=True, ignore_fraction=1.0,
        device=device_for(impl),
    )
    upstream = make_upstream(target, reduction, seed_for("all-ignored-up", reduction))
    got = run_fused(
        fusedce.linear_cross_entropy, hidden, weight, target, bias, upstream, impl=impl, **options.as_kwargs()
    )
    if reduction == "mean":
        assert torch.isnan(got.loss)
    else:
        assert torch.count_nonzero(got.loss) == 0
    for name, grad in (("hidden", got.grad_hidden), ("weight", got.grad_weight), ("bias", got.grad_bias)):
        assert torch.count_nonzero(grad) == 0 and not grad.isnan().any(), f"grad_{name} is not all zero"
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    assert_matches_reference(got, want, rtol=FP32_RTOL)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch_shape", [(0,), (2, 0)], ids=["N-0", "B-2_T-0"])
def test_zero_tokens_gives_nan_mean_zero_sum_and_empty_or_zero_grads(impl, reduction, batch_shape):
    """N = 0 as F.cross_entropy: mean → nan, sum → 0, none → empty; grad_hidden empty, grad_weight/bias 0."""
    options = with_reduction(MIXED.options, reduction)
    hidden, weight, target, bias = make_inputs(
        0, 8, 17, seed=seed_for("empty", impl, reduction), with_bias=True, batch_shape=batch_shape,
        device=device_for(impl),
    )
    upstream = make_upstream(target, reduction, seed_for("empty-up", reduction))
    got = run_fused(
        fusedce.linear_cross_entropy, hidden, weight, target, bias, upstream, impl=impl, **options.as_kwargs()
    )
    if reduction == "mean":
        assert got.loss.shape == () and torch.isnan(got.loss)
    elif reduction == "sum":
        assert got.loss.shape == () and got.loss.item() == 0.0
    else:
        assert got.loss.shape == batch_shape
    assert got.grad_hidden.shape == (*batch_shape, 8)
    assert torch.count_nonzero(got.grad_weight) == 0 and torch.count_nonzero(got.grad_bias) == 0
    assert not got.grad_weight.isnan().any() and not got.grad_bias.isnan().any()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_single_class_vocabulary_has_zero_cross_entropy_but_z_loss_and_its_grads(impl, reduction):
    """V = 1: log-softmax is 0, so only the z-loss term (through bias and soft-cap) remains."""
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl)
    device = device_for(impl)
    got = check_against_reference(
        fn, 9, 12, 1, SINGLE_CLASS_CASE, reduction, rtol=FP32_RTOL, seed=seed_for("V-1", impl, reduction),
        device=device,
    )
    assert torch.count_nonzero(got.grad_weight) > 0, "z-loss gradient missing at V = 1"
    plain = check_against_reference(
        fn, 9, 12, 1, OPTION_CASES["plain"], reduction, rtol=FP32_RTOL, seed=seed_for("V-1-plain", impl),
        device=device,
    )
    assert torch.count_nonzero(plain.loss) == 0


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch_shape", [(3, 5), (2, 3, 2), ()], ids=["3d", "4d", "unbatched"])
def test_leading_batch_dimensions_are_flattened_and_restored(impl, reduction, batch_shape):
    n = 1
    for d in batch_shape:
        n *= d
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl)
    got = check_against_reference(
        fn, n, 12, 19, MIXED, reduction, rtol=FP32_RTOL, seed=seed_for("batch", impl, reduction, batch_shape),
        batch_shape=batch_shape, device=device_for(impl),
    )
    assert got.grad_hidden.shape == (*batch_shape, 12)
    assert got.loss.shape == (batch_shape if reduction == "none" else ())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous_inputs_match_reference(impl, reduction, layout):
    """hidden / weight as transposed or every-other-column views, target and bias strided slices."""
    n, h, v = 11, 12, 23
    gen = torch.Generator().manual_seed(seed_for("non-contiguous", impl, reduction, layout))
    device = device_for(impl)

    def draw(*shape, scale=1.0):  # drawn on the CPU, moved contiguous, viewed on the device
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    if layout == "transposed":
        hidden, weight = draw(h, n).T, draw(h, v, scale=3 / h**0.5).T
    else:
        hidden, weight = draw(n, 2 * h)[:, ::2], draw(v, 2 * h, scale=3 / h**0.5)[:, 1::2]
    target = torch.randint(0, v, (2 * n,), generator=gen).to(device)[::2]
    target[::3] = -100
    bias = draw(2 * v)[1::2]
    assert not (hidden.is_contiguous() or weight.is_contiguous() or target.is_contiguous() or bias.is_contiguous())
    leaves = [t.detach().requires_grad_(True) for t in (hidden, weight, bias)]
    options = with_reduction(MIXED.options, reduction)
    upstream = make_upstream(target, reduction, seed_for("non-contiguous-up", reduction))
    got = run_fused(
        fusedce.linear_cross_entropy, *leaves[:2], target, leaves[2], upstream, impl=impl, **options.as_kwargs()
    )
    want = reference_linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], options, upstream)
    assert_matches_reference(got, want, rtol=FP32_RTOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("upstream_kind", ["sum-of-none", "sliced", "transposed"])
def test_none_reduction_accepts_expanded_and_strided_upstream_gradients(impl, upstream_kind):
    """``loss.sum().backward()`` sends a stride-0 gradient; slicing and transposing send strided ones."""
    hidden, weight, target, bias = make_inputs(
        4 * 5, 8, 13, seed=seed_for("upstream", impl, upstream_kind), with_bias=True, ignore_fraction=0.3,
        batch_shape=(4, 5), device=device_for(impl),
    )
    options = with_reduction(MIXED.options, "none")
    per_token = fusedce.linear_cross_entropy(hidden, weight, target, bias, impl=impl, **options.as_kwargs())
    gen = torch.Generator().manual_seed(seed_for("upstream-values", upstream_kind))
    if upstream_kind == "sum-of-none":
        per_token.sum().backward()
        upstream = torch.ones(target.shape)
    elif upstream_kind == "sliced":
        scale = torch.randn(4, 10, generator=gen)
        (per_token * scale.to(per_token.device)[:, ::2]).sum().backward()
        upstream = scale[:, ::2]
    else:
        scale = torch.randn(5, 4, generator=gen)
        (per_token.T * scale.to(per_token.device)).sum().backward()
        upstream = scale.T
    got = LossAndGrads(per_token.detach(), hidden.grad, weight.grad, bias.grad)
    upstream = upstream.to(target.device)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    assert_matches_reference(got, want, rtol=FP32_RTOL)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "trainable,with_bias",
    [("hidden", False), ("hidden", True), ("weight", False), ("weight", True), ("bias", True)],
    ids=["hidden-no-bias", "hidden-bias", "weight-no-bias", "weight-bias", "bias"],
)
def test_gradient_for_a_single_trainable_input(impl, trainable, with_bias):
    """A frozen LM head (LoRA, frozen tied embeddings) or a detached hidden: one input asks for a grad."""
    hidden, weight, target, bias = make_inputs(
        21, 12, 29, seed=seed_for("single-grad", impl, trainable, with_bias), with_bias=with_bias,
        ignore_fraction=0.3, device=device_for(impl),
    )
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is not None and name != trainable:
            t.requires_grad_(False)
    got = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl=impl, **MIXED.options.as_kwargs())
    want = reference_linear_cross_entropy(hidden, weight, target, bias, MIXED.options)
    assert_matches_reference(got, want, rtol=FP32_RTOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_input_dtypes_without_autocast_return_grads_in_each_inputs_dtype(impl):
    """bf16 hidden with an fp32 weight and bias, no autocast: compute in fp32, grads keep their dtypes."""
    hidden, weight, target, bias = make_inputs(
        21, 16, 37, seed=seed_for("mixed-dtypes", impl), with_bias=True, device=device_for(impl)
    )
    hidden = hidden.detach().to(torch.bfloat16).requires_grad_(True)
    got = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl=impl)
    assert got.grad_hidden.dtype == torch.bfloat16
    assert got.grad_weight.dtype == got.grad_bias.dtype == torch.float32
    want = reference_linear_cross_entropy(hidden, weight, target, bias)
    assert_matches_reference(got, want, rtol=1e-2, norm_only=True)


def test_float64_inputs_on_the_torch_path_match_the_reference_to_float64_precision():
    hidden, weight, target, bias = make_inputs(
        17, 12, 23, seed=seed_for("fp64"), with_bias=True, ignore_fraction=0.3, dtype=torch.float64
    )
    got = run_fused(
        fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="torch", **MIXED.options.as_kwargs()
    )
    assert got.loss.dtype == got.grad_weight.dtype == torch.float64
    want = reference_linear_cross_entropy(hidden, weight, target, bias, MIXED.options)
    assert_matches_reference(got, want, rtol=1e-10)


def test_every_ignore_index_default_is_fusedce_IGNORE_INDEX():
    """One constant, F.cross_entropy's -100, is the default of the function, the module and the options."""
    assert fusedce.IGNORE_INDEX == -100
    assert inspect.signature(fusedce.linear_cross_entropy).parameters["ignore_index"].default == fusedce.IGNORE_INDEX
    assert fusedce.LinearCrossEntropyLoss().ignore_index == fusedce.IGNORE_INDEX
    assert FusedOptions().ignore_index == fusedce.IGNORE_INDEX


@pytest.mark.parametrize("impl", IMPLS)
def test_ignore_index_beyond_the_vocabulary_is_ignored_not_an_error(impl):
    v = 19
    case = OptionCase(LossOptions(ignore_index=v + 3), ignore_fraction=0.4)
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl)
    got = check_against_reference(
        fn, 15, 8, v, case, "mean", rtol=FP32_RTOL, seed=seed_for("ignore-beyond", impl), device=device_for(impl)
    )
    assert torch.isfinite(got.loss)


@pytest.mark.parametrize("impl", IMPLS)
def test_int32_targets_give_the_same_result_as_int64(impl):
    hidden, weight, target, bias = make_inputs(
        15, 8, 21, seed=seed_for("int32", impl), with_bias=True, ignore_fraction=0.3, device=device_for(impl)
    )
    wide = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl=impl)
    narrow = run_fused(fusedce.linear_cross_entropy, hidden, weight, target.to(torch.int32), bias, impl=impl)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(wide, field), getattr(narrow, field)), field


@pytest.mark.parametrize("impl", IMPLS)
def test_very_large_logits_stay_finite_and_accurate(impl):
    """Logits with standard deviation ~80 (exp overflows fp32 without max-subtraction)."""
    fn = functools.partial(fusedce.linear_cross_entropy, impl=impl)
    case = OPTION_CASES["label_smoothing"]
    hidden, weight, target, _ = make_inputs(
        13, 16, 29, seed=seed_for("large-logits", impl), logit_std=80.0, device=device_for(impl)
    )
    got = run_fused(fn, hidden, weight, target, **case.options.as_kwargs())
    want = reference_linear_cross_entropy(hidden, weight, target, None, case.options)
    assert torch.isfinite(got.loss) and torch.isfinite(got.grad_hidden).all() and torch.isfinite(got.grad_weight).all()
    assert_matches_reference(got, want, rtol=FP32_RTOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_module_matches_the_function_bitwise(impl):
    options = {**MIXED.options.as_kwargs(), "impl": impl}
    loss_fn = fusedce.LinearCrossEntropyLoss(**options)
    assert isinstance(loss_fn, torch.nn.Module) and len(list(loss_fn.parameters())) == 0
    hidden, weight, target, bias = make_inputs(
        15, 8, 21, seed=seed_for("module", impl), with_bias=True, ignore_fraction=0.3, device=device_for(impl)
    )
    got = run_fused(lambda h, w, t, b: loss_fn(h, w, t, b), hidden, weight, target, bias)
    want = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, **options)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_module_bias_defaults_to_none():
    loss_fn = fusedce.LinearCrossEntropyLoss(reduction="sum")
    hidden, weight, target, _ = make_inputs(7, 8, 5, seed=seed_for("module-no-bias"))
    got = loss_fn(hidden, weight, target)
    want = reference_linear_cross_entropy(hidden, weight, target, None, LossOptions(reduction="sum"))
    torch.testing.assert_close(got.double(), want.loss, rtol=FP32_RTOL, atol=0)


def test_auto_impl_on_cpu_tensors_is_the_torch_path():
    hidden, weight, target, bias = make_inputs(15, 8, 21, seed=seed_for("auto"), with_bias=True, ignore_fraction=0.3)
    options = MIXED.options.as_kwargs()
    auto = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="auto", **options)
    torch_ = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="torch", **options)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(auto, field), getattr(torch_, field)), field


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_two_runs_are_bitwise_identical(impl, reduction):
    options = with_reduction(MIXED.options, reduction)
    hidden, weight, target, bias = make_inputs(
        37, 24, 53, seed=seed_for("determinism", impl, reduction), with_bias=True, ignore_fraction=0.3,
        device=device_for(impl),
    )
    upstream = make_upstream(target, reduction, seed_for("determinism-up", reduction))
    runs = [
        run_fused(
            fusedce.linear_cross_entropy, hidden, weight, target, bias, upstream, impl=impl, **options.as_kwargs()
        )
        for _ in range(2)
    ]
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        a, b = getattr(runs[0], field), getattr(runs[1], field)
        assert torch.equal(a, b), f"{field} differs between two identical runs"


def test_torch_compile_of_a_function_calling_fusedce_matches_eager():
    """Dynamo + AOTAutograd (aot_eager: no C++ compiler needed) trace the loss through its fake
    implementations; the compiled forward and backward equal eager ones."""
    torch._dynamo.reset()
    options = MIXED.options.as_kwargs()
    hidden, weight, target, bias = make_inputs(
        33, 16, 41, seed=seed_for("compile"), with_bias=True, ignore_fraction=0.3
    )

    def loss_fn(hidden, weight, target, bias):
        return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", **options)

    eager = run_fused(loss_fn, hidden, weight, target, bias)
    compiled = run_fused(torch.compile(loss_fn, backend="aot_eager"), hidden, weight, target, bias)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        torch.testing.assert_close(getattr(compiled, field), getattr(eager, field), rtol=1e-6, atol=0)


@pytest.mark.parametrize("k,n", [(24, 19), (19, 24), (19, 21), (16, 8), (5, 3)],
                         ids=["ragged-N", "ragged-K", "both", "aligned", "below-one-block"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_matmul_split_at_ragged_dimensions_equals_one_product(k, n, accumulate):
    """The aligned-part-plus-tail split that CUDA uses (forced here on the CPU), into a
    padded-row output as the logits block is."""
    from fusedce.matmul import matmul_into

    gen = torch.Generator().manual_seed(k * 100 + n)
    a, b = torch.randn(6, k, generator=gen), torch.randn(k, n, generator=gen)
    start = torch.randn(6, n, generator=gen)
    out = torch.empty(6, n + 5)[:, :n]
    out.copy_(start)
    matmul_into(out, a, b, accumulate=accumulate, align=True)
    torch.testing.assert_close(out, (start if accumulate else 0) + a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, name", [(torch.bfloat16, "allow_bf16_reduced_precision_reduction"),
                                         (torch.float16, "allow_fp16_reduced_precision_reduction")])
def test_a_2_byte_product_on_cuda_is_summed_in_fp32_and_the_switch_is_restored(dtype, name):
    """:func:`fusedce.matmul.one_rounding` turns PyTorch's reduced-precision switch off for a product that
    writes a 2-byte output on CUDA (a stand-in tensor: only its dtype and device are read), restores it
    after, an exception too, and leaves it alone for a CPU or fp32 output."""
    import types

    from fusedce.matmul import one_rounding

    before = getattr(torch.backends.cuda.matmul, name)  # the switch has no attribute to monkeypatch
    setattr(torch.backends.cuda.matmul, name, True)
    try:
        on_cuda = types.SimpleNamespace(dtype=dtype, device=torch.device("cuda"))
        with one_rounding(on_cuda):
            assert getattr(torch.backends.cuda.matmul, name) is False
        assert getattr(torch.backends.cuda.matmul, name) is True
        with pytest.raises(RuntimeError), one_rounding(on_cuda):
            raise RuntimeError("a failed product")
        assert getattr(torch.backends.cuda.matmul, name) is True
        for other in (types.SimpleNamespace(dtype=dtype, device=torch.device("cpu")),
                      types.SimpleNamespace(dtype=torch.float32, device=torch.device("cuda"))):
            with one_rounding(other):
                assert getattr(torch.backends.cuda.matmul, name) is True
    finally:
        setattr(torch.backends.cuda.matmul, name, before)


def test_a_thread_leaving_its_product_keeps_the_switch_off_for_a_thread_still_inside():
    """Each thread restored the switch it had saved on leaving: a product of another thread still inside
    then ran with the reduced-precision reduction on (two threads: one process driving two GPUs)."""
    import threading
    import types

    from fusedce.matmul import one_rounding

    name = "allow_bf16_reduced_precision_reduction"
    before = getattr(torch.backends.cuda.matmul, name)
    setattr(torch.backends.cuda.matmul, name, True)
    on_cuda = types.SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda"))
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with one_rounding(on_cuda):
            a_inside.set()
            b_inside.wait(10)
        a_left.set()

    def b():
        a_inside.wait(10)
        with one_rounding(on_cuda):
            b_inside.set()
            a_left.wait(10)
            seen["b, after a left"] = getattr(torch.backends.cuda.matmul, name)

    try:
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert seen == {"b, after a left": False}
        assert getattr(torch.backends.cuda.matmul, name) is True  # restored once both left
    finally:
        setattr(torch.backends.cuda.matmul, name, before)
