"""The time–memory knob: ``memory_budget`` and ``strategy`` against the float64 reference.

Every point of the frontier computes the same loss: each strategy ("recompute", "precompute"
in one row chunk and in several) and each budget ("min", "fast", bytes, a multiple of the
floor) is held to the reference on ragged sizes, with ignored targets and every option
(label smoothing, z-loss, soft-cap, bias) and each reduction it takes, on the PyTorch path
and (``TRITON_INTERPRET=1``) the Triton path. Also: the planner picks the strategy the
budget asks for, bad knob values fail in one line naming the argument, runs are bitwise
deterministic, the bf16 per-chunk grad_weight policy stays within bf16 error, and the memory
model predicts each strategy's measured CPU peak within the profiler's ±5 %.
"""
import functools
import importlib.util
import os

import pytest
import torch

import fusedce
from fusedce.memory_model import predict_peak_bytes
from fusedce.planner import plan_chunks
from fusedce_profiler.instrument.protocol import MemoryMeter, settle
from reference import (
    OPTION_CASES,
    check_against_reference,
    make_inputs,
    reference_linear_cross_entropy,
    relative_error,
    run_fused,
    seed_for,
    LossOptions,
)

FP32_RTOL = 1e-5
BF16_RTOL = 1e-2

# name: (keyword arguments, reductions it takes)
SETTINGS = {
    "recompute": ({"strategy": "recompute"}, ("mean", "sum", "none")),
    "precompute": ({"strategy": "precompute"}, ("mean", "sum")),
    "precompute-row-chunks": ({"strategy": "precompute", "chunk_size": 16}, ("mean", "sum")),
    "budget-min": ({"memory_budget": "min"}, ("mean", "sum", "none")),
    "budget-fast": ({"memory_budget": "fast"}, ("mean", "sum", "none")),
    "budget-bytes": ({"memory_budget": 4096}, ("mean", "sum", "none")),
    "budget-floor-multiple": ({"memory_budget": 1.5}, ("mean", "sum", "none")),
}

TRITON = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or (not torch.cuda.is_available()
                                                   and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="the Triton path needs CUDA or TRITON_INTERPRET=1")


def _cases():
    for name, (_, reductions) in SETTINGS.items():
        for reduction in reductions:
            yield pytest.param(name, reduction, id=f"{name}-{reduction}")


@pytest.mark.parametrize("case_name", ["plain", "ignored_targets", "label_smoothing", "z_loss", "softcap", "bias",
                                       "mixed"])
@pytest.mark.parametrize("setting,reduction", list(_cases()))
def test_every_strategy_and_option_matches_the_fp64_reference(setting, reduction, case_name):
    kwargs, _ = SETTINGS[setting]
    fn = functools.partial(fusedce.linear_cross_entropy, impl="torch")
    check_against_reference(fn, 45, 24, 131, OPTION_CASES[case_name], reduction, rtol=FP32_RTOL,
                            seed=seed_for("strategy", setting, reduction, case_name), **kwargs)


@pytest.mark.parametrize("n,h,v", [(1, 8, 2), (37, 40, 131), (129, 72, 1009), (50, 5, 3)],
                         ids=["single-token", "odd-N_prime-V", "larger-ragged", "tiny-H"])
@pytest.mark.parametrize("setting", ["precompute", "precompute-row-chunks", "budget-min", "budget-fast"])
def test_ragged_sizes_match_the_reference(setting, n, h, v):
    kwargs, _ = SETTINGS[setting]
    fn = functools.partial(fusedce.linear_cross_entropy, impl="torch")
    check_against_reference(fn, n, h, v, OPTION_CASES["mixed"], "mean", rtol=FP32_RTOL,
                            seed=seed_for("ragged", setting, n, h, v), **kwargs)


@TRITON
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("setting", ["precompute", "precompute-row-chunks"])
def test_precompute_on_the_triton_path_matches_the_reference(setting, reduction):
    kwargs, _ = SETTINGS[setting]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fn = functools.partial(fusedce.linear_cross_entropy, impl="triton")
    check_against_reference(fn, 40, 16, 97, OPTION_CASES["mixed"], reduction, rtol=FP32_RTOL,
                            seed=seed_for("triton", setting, reduction), device=device, **kwargs)


def test_the_budget_picks_the_strategy():
    """"fast" computes gradients in forward when the whole block fits and H ≥ 2048 (below, the FLOPs
    it saves take less time than its whole-vocabulary rows cost); the default, "min" and
    reduction="none" recompute; an explicit "precompute" is honoured at any size."""
    common = dict(hidden_dtype=torch.bfloat16, weight_dtype=torch.float32, compute_dtype=torch.bfloat16,
                  needs_grad=True)
    n, h, v = 8192, 768, 32777
    assert plan_chunks(n, 4096, 128256, memory_budget="fast", scalar_loss=True, **common).strategy == "precompute"
    assert plan_chunks(n, 2048, v, memory_budget=3.0, scalar_loss=True, **common).strategy == "precompute"
    assert plan_chunks(n, h, v, memory_budget="fast", scalar_loss=True, **common).strategy == "recompute"
    assert plan_chunks(n, 2047, v, memory_budget=3.0, scalar_loss=True, **common).strategy == "recompute"
    assert plan_chunks(n, h, v, scalar_loss=True, **common).strategy == "recompute"
    assert plan_chunks(n, h, v, memory_budget="min", scalar_loss=True, **common).strategy == "recompute"
    assert plan_chunks(n, h, v, memory_budget="fast", scalar_loss=False, **common).strategy == "recompute"
    explicit = plan_chunks(n, h, v, strategy="precompute", memory_budget="min", scalar_loss=True, **common)
    assert explicit.strategy == "precompute" and 1024 <= explicit.rows < n and explicit.cols == v
    by_name = plan_chunks(n, 4096, 128256, strategy="precompute", scalar_loss=True, **common)  # default budget
    assert by_name.rows >= 1024, "asked for by name, precompute never runs in tiny row chunks"
    small = plan_chunks(n, h, v, memory_budget="min", scalar_loss=True, **common)
    default = plan_chunks(n, h, v, scalar_loss=True, **common)
    assert small.rows * small.cols < default.rows * default.cols


@pytest.mark.parametrize("kwargs,needle", [
    ({"strategy": "fastest"}, "strategy"),
    ({"memory_budget": "tiny"}, "memory_budget"),
    ({"memory_budget": 0}, "memory_budget"),
    ({"memory_budget": -5}, "memory_budget"),
    ({"memory_budget": 0.5}, "memory_budget"),
    ({"memory_budget": float("nan")}, "memory_budget"),
    ({"memory_budget": float("inf")}, "memory_budget"),
    ({"memory_budget": True}, "memory_budget"),
    ({"grad_weight_accumulation": "bf16"}, "grad_weight_accumulation"),
    ({"strategy": "precompute", "reduction": "none"}, "precompute"),
    ({"strategy": "precompute", "vocab_chunk_size": 64}, "vocab_chunk_size"),
])
def test_bad_knob_values_fail_in_one_line_naming_the_argument(kwargs, needle):
    hidden, weight, target, bias = make_inputs(6, 8, 11, seed=1)
    with pytest.raises(ValueError) as info:
        fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", **kwargs)
    message = str(info.value)
    assert needle in message and "\n" not in message
    with pytest.raises(ValueError):  # the module checks at construction, before any input exists
        fusedce.LinearCrossEntropyLoss(**{k: val for k, val in kwargs.items() if k != "reduction"},
                                       **({"reduction": kwargs["reduction"]} if "reduction" in kwargs else {}))(
            hidden, weight, target, bias)


def test_precompute_refuses_float16_compute_in_one_line():
    hidden, weight, target, _ = make_inputs(6, 8, 11, seed=2, dtype=torch.float16)
    with pytest.raises(ValueError) as info:
        fusedce.linear_cross_entropy(hidden, weight, target, impl="torch", strategy="precompute")
    assert "float16" in str(info.value) and "\n" not in str(info.value)


def test_precompute_refuses_a_second_backward_through_the_same_graph():
    hidden, weight, target, bias = make_inputs(20, 8, 31, seed=3, with_bias=True)
    loss = fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", strategy="precompute")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="recompute"):
        loss.backward()


@pytest.mark.parametrize("setting", ["precompute-row-chunks", "budget-min", "recompute"])
def test_runs_are_bitwise_deterministic(setting):
    kwargs, _ = SETTINGS[setting]
    results = []
    for _ in range(2):
        hidden, weight, target, bias = make_inputs(70, 24, 257, seed=4, with_bias=True, ignore_fraction=0.2)
        results.append(run_fused(functools.partial(fusedce.linear_cross_entropy, impl="torch"), hidden, weight,
                                 target, bias, 0.75, label_smoothing=0.1, z_loss=1e-3, softcap=4.0, **kwargs))
    first, second = results
    for a, b in ((first.loss, second.loss), (first.grad_hidden, second.grad_hidden),
                 (first.grad_weight, second.grad_weight), (first.grad_bias, second.grad_bias)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("strategy", ["precompute", "recompute"])
def test_bf16_per_chunk_grad_weight_stays_within_bf16_error(strategy):
    """Pure bf16, 64 tokens in row chunks of 8: grad_weight rounded into bf16 once per chunk
    ("per_chunk") or once at the end ("fp32"); both within bf16's tolerance, and they differ
    (the policy takes effect)."""
    options = LossOptions(label_smoothing=0.1, z_loss=1e-3)
    got = {}
    for policy in ("fp32", "per_chunk"):
        hidden, weight, target, _ = make_inputs(64, 32, 200, seed=5, dtype=torch.bfloat16)
        got[policy] = run_fused(functools.partial(fusedce.linear_cross_entropy, impl="torch"), hidden, weight,
                                target, None, 1.0, strategy=strategy, chunk_size=8, grad_weight_accumulation=policy,
                                **options.as_kwargs())
    hidden, weight, target, _ = make_inputs(64, 32, 200, seed=5, dtype=torch.bfloat16)
    want = reference_linear_cross_entropy(hidden, weight, target, None, options, 1.0)
    for policy, result in got.items():
        assert relative_error(result.grad_weight, want.grad_weight) <= BF16_RTOL, policy
        assert relative_error(result.grad_hidden, want.grad_hidden) <= BF16_RTOL, policy
        assert result.grad_weight.dtype == torch.bfloat16
    assert not torch.equal(got["fp32"].grad_weight, got["per_chunk"].grad_weight)


def test_per_chunk_error_grows_with_the_row_chunks_and_fp32_does_not():
    """Pure bf16, 4096 tokens: 64 row chunks rounded into bf16 one by one lose accuracy
    against one rounding of the fp32 sum (fusedce/DESIGN.md's measurement)."""
    hidden, weight, target, _ = make_inputs(4096, 64, 512, seed=11, dtype=torch.bfloat16)
    want = reference_linear_cross_entropy(hidden, weight, target, None, LossOptions(), 1.0).grad_weight
    error = {}
    for policy in ("fp32", "per_chunk"):
        for chunks in (1, 64):
            got = run_fused(functools.partial(fusedce.linear_cross_entropy, impl="torch"), hidden, weight, target,
                            None, 1.0, chunk_size=4096 // chunks, grad_weight_accumulation=policy,
                            strategy="precompute")
            error[policy, chunks] = relative_error(got.grad_weight, want)
    assert error["per_chunk", 1] == error["fp32", 1]
    assert error["fp32", 64] < 1.1 * error["fp32", 1]
    assert error["per_chunk", 64] > 1.5 * error["fp32", 64]


F32, BF16 = torch.float32, torch.bfloat16
MODES = {"amp-bf16": (BF16, F32, BF16), "fp32": (F32, F32, None), "bf16": (BF16, BF16, None)}


def _step_peak(n, h, v, hidden_dtype, weight_dtype, autocast, bias, kwargs) -> int:
    """Peak extra bytes of one forward+backward on the CPU, inputs and upstream allocated before."""
    gen = torch.Generator().manual_seed(n + h + v)
    hidden = torch.randn(n, h, generator=gen).to(hidden_dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) * h ** -0.5).to(weight_dtype).requires_grad_()
    b = (torch.randn(v, generator=gen) * 0.1).to(weight_dtype).requires_grad_() if bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    target[::5] = fusedce.IGNORE_INDEX
    settle("cpu")
    context = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
    with MemoryMeter("cpu") as meter:
        meter.mark("forward")
        with context:
            loss = fusedce.linear_cross_entropy(hidden, weight, target, b, impl="torch", **kwargs)
        meter.mark("backward")
        loss.backward()
    return meter.record.peak_bytes


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("setting", ["precompute", "precompute-row-chunks", "budget-min", "budget-fast",
                                     "recompute"])
def test_memory_model_predicts_each_strategys_measured_cpu_peak(setting, mode, bias):
    kwargs, _ = SETTINGS[setting]
    kwargs = {**kwargs, "chunk_size": 128} if "chunk_size" in kwargs else kwargs
    n, h, v = 512, 32, 3000
    hidden_dtype, weight_dtype, autocast = MODES[mode]
    compute_dtype = autocast or torch.promote_types(hidden_dtype, weight_dtype)
    prediction = predict_peak_bytes(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                                    compute_dtype=compute_dtype, has_bias=bias,
                                    bias_dtype=weight_dtype if bias else None, impl="torch", **kwargs)
    expected = "precompute" if setting.startswith("precompute") else "recompute"  # "fast" at H = 32 recomputes
    assert prediction.plan.strategy == expected
    measured = _step_peak(n, h, v, hidden_dtype, weight_dtype, autocast, bias, kwargs)
    assert abs(prediction.step - measured) <= 0.05 * measured, (prediction.step, measured)


def test_precompute_compiles_fullgraph_and_matches_eager():
    """The gradients-in-forward op and its backward's in-place scale trace under torch.compile."""
    torch._dynamo.reset()
    hidden, weight, target, bias = make_inputs(64, 16, 97, seed=6, with_bias=True, ignore_fraction=0.2)

    def loss_fn(hidden, weight, target, bias):
        return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", strategy="precompute",
                                            label_smoothing=0.1, z_loss=1e-4, softcap=30.0, validate_targets=False)

    eager = run_fused(loss_fn, hidden, weight, target, bias, 0.75)
    compiled = run_fused(torch.compile(loss_fn, fullgraph=True), hidden, weight, target, bias, 0.75)
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(eager, field), getattr(compiled, field)), field
