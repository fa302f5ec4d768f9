"""The Triton path on a CUDA device at realistic shapes (``@pytest.mark.gpu``; skipped without CUDA).

Parity rule: eager PyTorch in the same precision is the yardstick. For the loss and each
gradient, the fused result's relative error against a float64 reference (computed in row
chunks, so N·V > 2³¹ fits) must be at most 1.5× eager's error plus a small slack: 1e-5 for
fp32 operands, 1e-3 for bf16/fp16 operands. The errors of both are attached to each test
as junit properties (``--junitxml``).
"""
import functools

import pytest
import torch
import torch.nn.functional as F

import fusedce
from reference import (
    OPTION_CASES,
    REDUCTIONS,
    LossAndGrads,
    LossOptions,
    OptionCase,
    chunked_reference_linear_cross_entropy,
    make_inputs,
    make_upstream,
    relative_error,
    run_fused,
    seed_for,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"
GPT2_HEAD = (4096, 768, 32777)  # N, H, V: V odd, not a multiple of any block size
GPT2_VOCAB = (4096, 1024, 50257)
SLACK = {torch.float32: 1e-5, torch.bfloat16: 1e-3, torch.float16: 1e-3}
FIELDS = ("loss", "grad_hidden", "grad_weight", "grad_bias")

fused_triton = functools.partial(fusedce.linear_cross_entropy, impl="triton")


def eager_loss(hidden, weight, target, bias=None, *, ignore_index=-100, reduction="mean",
               label_smoothing=0.0, z_loss=0.0, softcap=None):
    """The specification in eager PyTorch with full logits: the precision yardstick."""
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat, flat_target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    per_token = F.cross_entropy(
        flat, flat_target, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing
    )
    valid = flat_target != ignore_index
    if z_loss:
        per_token = per_token + z_loss * torch.logsumexp(flat, dim=-1).square() * valid
    if reduction == "none":
        return per_token.reshape(target.shape)
    if reduction == "sum":
        return per_token.sum()
    return per_token.sum() / valid.sum()


def cast_inputs(hidden, weight, bias, hidden_dtype, weight_dtype):
    """Leaf copies in the given dtypes (bias follows the weight, as in an LM head)."""
    def leaf(t, dtype):
        return None if t is None else t.detach().to(dtype).requires_grad_(True)

    return leaf(hidden, hidden_dtype), leaf(weight, weight_dtype), leaf(bias, weight_dtype)


def compare_with_eager(record_property, case: OptionCase, reduction: str, shape, *, hidden_dtype,
                       weight_dtype, autocast_dtype=None, seed: int, knobs: dict | None = None) -> LossAndGrads:
    """Run fused (with the planner ``knobs``, e.g. a strategy) and eager in the same
    precision; both against the float64 reference."""
    n, h, v = shape
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(
        n, h, v, seed=seed, with_bias=case.with_bias, ignore_fraction=case.ignore_fraction,
        ignore_index=options.ignore_index, device=DEVICE,
    )
    hidden, weight, bias = cast_inputs(hidden, weight, bias, hidden_dtype, weight_dtype)
    upstream = make_upstream(target, reduction, seed + 1)
    with torch.autocast(DEVICE, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        fused = run_fused(fused_triton, hidden, weight, target, bias, upstream, **options.as_kwargs(),
                          **(knobs or {}))
        eager = run_fused(eager_loss, hidden, weight, target, bias, upstream, **options.as_kwargs())
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        got = getattr(fused, f"grad_{name}")
        assert t is None or got.dtype == t.dtype, f"grad_{name} is {got.dtype}, {name} is {t.dtype}"
    ref = chunked_reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream, rows_per_chunk=512)
    operand_dtype = autocast_dtype or torch.promote_types(hidden_dtype, weight_dtype)
    assert_within_eager_error(record_property, fused, eager, ref, SLACK[operand_dtype])
    return fused


def assert_within_eager_error(record_property, fused: LossAndGrads, eager: LossAndGrads, ref: LossAndGrads,
                              slack: float, rows: slice | None = None) -> None:
    """error(fused) ≤ 1.5·error(eager) + slack for every field (on ``rows`` of per-row fields if given)."""
    failures = []
    for field in FIELDS:
        want = getattr(ref, field)
        if want is None:
            continue
        got, yardstick = getattr(fused, field), getattr(eager, field)
        if rows is not None and field in ("loss", "grad_hidden") and want.dim() > 0:
            want, got, yardstick = want[rows], got[rows], yardstick[rows]
        err_fused, err_eager = relative_error(got, want), relative_error(yardstick, want)
        record_property(f"{field}_rel_err_fused", f"{err_fused:.3e}")
        record_property(f"{field}_rel_err_eager", f"{err_eager:.3e}")
        if not err_fused <= 1.5 * err_eager + slack:  # also fails on NaN
            failures.append(f"{field}: fused {err_fused:.3g} > 1.5 × eager {err_eager:.3g} + {slack:g}")
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case_name", list(OPTION_CASES))
def test_every_option_in_bf16_is_as_accurate_as_eager(record_property, case_name, reduction):
    compare_with_eager(
        record_property, OPTION_CASES[case_name], reduction, GPT2_HEAD, hidden_dtype=torch.bfloat16,
        weight_dtype=torch.bfloat16, seed=seed_for("gpu-option", case_name, reduction),
    )


@pytest.mark.parametrize("case_name", ["plain", "mixed"])
@pytest.mark.parametrize("shape", [GPT2_HEAD, GPT2_VOCAB], ids=["4096x768x32777", "4096x1024x50257"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_each_input_dtype_is_as_accurate_as_eager(record_property, dtype, shape, case_name):
    compare_with_eager(
        record_property, OPTION_CASES[case_name], "mean", shape, hidden_dtype=dtype, weight_dtype=dtype,
        seed=seed_for("gpu-dtype", dtype, shape, case_name),
    )


@pytest.mark.parametrize("case_name", ["plain", "mixed"])
@pytest.mark.parametrize("hidden_is_fp32", [False, True], ids=["low-precision-hidden", "fp32-hidden"])
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_with_fp32_master_weight_returns_fp32_weight_grad(
    record_property, autocast_dtype, hidden_is_fp32, case_name
):
    """The Lightning 'bf16-mixed' / 'fp16-mixed' set-up; fp32 hidden (a norm's output) gets an fp32 grad."""
    compare_with_eager(
        record_property, OPTION_CASES[case_name], "mean", GPT2_VOCAB,
        hidden_dtype=torch.float32 if hidden_is_fp32 else autocast_dtype, weight_dtype=torch.float32,
        autocast_dtype=autocast_dtype, seed=seed_for("gpu-autocast", autocast_dtype, hidden_is_fp32, case_name),
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_more_than_2_to_the_31_logits(record_property, reduction):
    """N·V = 8256 · 262144 > 2³¹: the last 64 tokens' logits lie past every int32 offset."""
    n, h, v = 8256, 64, 262144
    assert (n - 64) * v >= 2**31
    case = OPTION_CASES["mixed"]
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(
        n, h, v, seed=seed_for("gpu-2^31", reduction), with_bias=True, ignore_fraction=case.ignore_fraction,
        device=DEVICE,
    )
    hidden, weight, bias = cast_inputs(hidden, weight, bias, torch.bfloat16, torch.bfloat16)
    upstream = make_upstream(target, reduction, seed_for("gpu-2^31-up", reduction))
    fused = run_fused(fused_triton, hidden, weight, target, bias, upstream, **options.as_kwargs())
    eager = run_fused(eager_loss, hidden, weight, target, bias, upstream, **options.as_kwargs())
    ref = chunked_reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream, rows_per_chunk=256)
    assert_within_eager_error(record_property, fused, eager, ref, SLACK[torch.bfloat16])
    tail = slice(n - 64, n)
    assert_within_eager_error(record_property, fused, eager, ref, SLACK[torch.bfloat16], rows=tail)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_zero_tokens(reduction):
    hidden, weight, target, bias = make_inputs(0, 64, 1000, seed=seed_for("gpu-empty"), with_bias=True, device=DEVICE)
    options = {**OPTION_CASES["mixed"].options.as_kwargs(), "reduction": reduction}
    got = run_fused(fused_triton, hidden, weight, target, bias, **options)
    if reduction == "mean":
        assert torch.isnan(got.loss)
    elif reduction == "sum":
        assert got.loss.item() == 0.0
    else:
        assert got.loss.shape == (0,)
    assert got.grad_hidden.shape == (0, 64)
    assert torch.count_nonzero(got.grad_weight) == 0 and torch.count_nonzero(got.grad_bias) == 0


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16", "amp"])
def test_two_runs_are_bitwise_identical(autocast):
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        *GPT2_VOCAB, seed=seed_for("gpu-determinism", autocast), with_bias=True,
        ignore_fraction=case.ignore_fraction, device=DEVICE,
    )
    weight_dtype = torch.float32 if autocast else torch.bfloat16
    hidden, weight, bias = cast_inputs(hidden, weight, bias, torch.bfloat16, weight_dtype)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        runs = [run_fused(fused_triton, hidden, weight, target, bias, **case.options.as_kwargs()) for _ in range(2)]
    for field in FIELDS:
        assert torch.equal(getattr(runs[0], field), getattr(runs[1], field)), f"{field} differs between runs"


def test_auto_impl_on_cuda_is_the_triton_path():
    hidden, weight, target, bias = make_inputs(512, 128, 5003, seed=seed_for("gpu-auto"), with_bias=True, device=DEVICE)
    auto = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="auto")
    triton = run_fused(fused_triton, hidden, weight, target, bias)
    for field in FIELDS:
        assert torch.equal(getattr(auto, field), getattr(triton, field)), field


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph-breaks-allowed", "fullgraph"])
def test_torch_compile_of_a_function_calling_fusedce_matches_eager(fullgraph):
    """Compiled and eager calls run the same kernels: equal up to the order of the final mean."""
    torch._dynamo.reset()
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        1024, 256, 8191, seed=seed_for("gpu-compile", fullgraph), with_bias=True,
        ignore_fraction=case.ignore_fraction, device=DEVICE,
    )

    def loss_fn(hidden, weight, target, bias):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="triton", **case.options.as_kwargs())

    compiled = torch.compile(loss_fn, fullgraph=fullgraph)
    eager = run_fused(loss_fn, hidden, weight, target, bias)
    comp = run_fused(compiled, hidden, weight, target, bias)
    assert comp.grad_weight.dtype == torch.float32 and comp.grad_hidden.dtype == torch.float32
    for field in FIELDS:
        err = relative_error(getattr(comp, field), getattr(eager, field))
        assert err <= 1e-6, f"{field}: compiled vs eager relative difference {err:.3g}"


def test_torch_compile_fullgraph_of_a_pure_bf16_loss_matches_eager():
    """bf16 hidden and weight, no autocast: the tiled plan is decided while Dynamo traces (fake
    tensors, no addresses) and the compiled call runs the same tiled kernels as eager."""
    torch._dynamo.reset()
    hidden, weight, target, bias = make_inputs(1024, 256, 8191, seed=seed_for("gpu-compile-bf16"), with_bias=True,
                                               ignore_fraction=0.2, device=DEVICE, dtype=torch.bfloat16)

    def loss_fn(hidden, weight, target, bias):
        return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="triton", label_smoothing=0.1)

    eager = run_fused(loss_fn, hidden, weight, target, bias)
    comp = run_fused(torch.compile(loss_fn, fullgraph=True), hidden, weight, target, bias)
    for field in FIELDS:  # the compiled mean may round once more: within one bf16 step
        err = relative_error(getattr(comp, field), getattr(eager, field))
        assert err <= 8e-3, f"{field}: compiled vs eager relative difference {err:.3g}"


STRATEGY_KNOBS = {
    "precompute": {"strategy": "precompute"},
    "precompute-row-chunks": {"strategy": "precompute", "chunk_size": 1024},
    "budget-fast": {"memory_budget": "fast"},
    "budget-min": {"memory_budget": "min"},
    "fast-per-chunk": {"memory_budget": "fast", "grad_weight_accumulation": "per_chunk", "chunk_size": 1024},
    "split-backward": {"memory_budget": 8 << 20},  # bf16: grad_hidden's pass in row chunks of 1408
}


@pytest.mark.parametrize("mode", ["bf16", "amp"])
@pytest.mark.parametrize("case_name,reduction", [("plain", "mean"), ("mixed", "mean"), ("mixed", "sum")])
@pytest.mark.parametrize("knobs", list(STRATEGY_KNOBS))
def test_every_strategy_is_as_accurate_as_eager(record_property, knobs, case_name, reduction, mode):
    """Each frontier point at the user's head (split-K products for precompute's grad_hidden
    on CUDA), pure bf16 and amp (fp32 weight under bf16 autocast)."""
    amp = mode == "amp"
    compare_with_eager(
        record_property, OPTION_CASES[case_name], reduction, GPT2_HEAD, hidden_dtype=torch.bfloat16,
        weight_dtype=torch.float32 if amp else torch.bfloat16, autocast_dtype=torch.bfloat16 if amp else None,
        seed=seed_for("gpu-strategy", knobs, case_name, reduction, mode), knobs=STRATEGY_KNOBS[knobs],
    )


KEPT_HEAD = (4096, 2048, 32777)  # "fast" in bf16 keeps the logits of part of the vocabulary here


@pytest.mark.parametrize("case_name,reduction", [("plain", "mean"), ("mixed", "mean"), ("mixed", "none")])
def test_kept_logits_are_as_accurate_as_eager(record_property, case_name, reduction):
    """``"fast"`` in pure bf16 at H = 2048: the forward keeps bf16 logits of part of the vocabulary for the
    backward (fusedce/kept_plan.py); every field within eager's error, and runs bitwise identical."""
    from fusedce.planner import plan_chunks

    plan = plan_chunks(*KEPT_HEAD, hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                       compute_dtype=torch.bfloat16, memory_budget="fast", scalar_loss=reduction != "none",
                       needs_grad=True, cuda=True, sm_count=torch.cuda.get_device_properties(0).multi_processor_count,
                       tiled=True)
    assert plan.kept_cols > 0, plan
    runs = [compare_with_eager(record_property, OPTION_CASES[case_name], reduction, KEPT_HEAD,
                               hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                               seed=seed_for("gpu-kept", case_name, reduction), knobs={"memory_budget": "fast"})
            for _ in range(2)]
    for field in FIELDS:
        assert (getattr(runs[0], field) is None) == (getattr(runs[1], field) is None)
        assert getattr(runs[0], field) is None or torch.equal(getattr(runs[0], field), getattr(runs[1], field))


@pytest.mark.parametrize("knobs", ["precompute-row-chunks", "budget-fast", "fast-per-chunk", "split-backward"])
def test_strategies_are_bitwise_deterministic_on_cuda(knobs):
    runs = []
    for _ in range(3):
        hidden, weight, target, bias = make_inputs(GPT2_HEAD[0], GPT2_HEAD[1], GPT2_HEAD[2], seed=7,
                                                   with_bias=True, ignore_fraction=0.2, device=DEVICE,
                                                   dtype=torch.bfloat16)
        runs.append(run_fused(fused_triton, hidden, weight, target, bias, 0.5, label_smoothing=0.1, z_loss=1e-4,
                              **STRATEGY_KNOBS[knobs]))
    for other in runs[1:]:
        for field in FIELDS:
            assert torch.equal(getattr(runs[0], field), getattr(other, field)), field


def test_torch_compile_of_the_precompute_strategy_matches_eager():
    """fullgraph: the gradients-in-forward op and the in-place scale of its backward trace."""
    torch._dynamo.reset()
    hidden, weight, target, bias = make_inputs(1024, 256, 8191, seed=seed_for("gpu-compile-precompute"),
                                               with_bias=True, ignore_fraction=0.3, device=DEVICE)

    def loss_fn(hidden, weight, target, bias):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="triton", strategy="precompute",
                                                label_smoothing=0.1, z_loss=1e-4, softcap=30.0)

    eager = run_fused(loss_fn, hidden, weight, target, bias, 0.75)
    comp = run_fused(torch.compile(loss_fn, fullgraph=True), hidden, weight, target, bias, 0.75)
    for field in FIELDS:
        err = relative_error(getattr(comp, field), getattr(eager, field))
        assert err <= 1e-6, f"{field}: compiled vs eager relative difference {err:.3g}"


class TinyHead(torch.nn.Module):
    """A LayerNorm (fp32 output under autocast) feeding an fp32 LM head through fusedce."""

    def __init__(self, h: int, v: int, options: dict):
        super().__init__()
        self.norm = torch.nn.LayerNorm(h)
        self.lm_head = torch.nn.Linear(h, v, bias=False)
        self.options = options

    def forward(self, x, target):
        return fusedce.linear_cross_entropy(self.norm(x), self.lm_head.weight, target, impl="triton", **self.options)


def test_compiled_model_with_fusedce_head_compiles_fullgraph_and_trains_like_eager():
    """fullgraph=True through the norm and the loss; the compiled norm rounds differently, so
    compiled vs eager agree to bf16 precision, not bitwise."""
    torch._dynamo.reset()
    n, h, v = 1024, 256, 8191
    gen = torch.Generator().manual_seed(seed_for("gpu-compile-model"))
    x = torch.randn(n, h, generator=gen).to(DEVICE)
    target = torch.randint(0, v, (n,), generator=gen).to(DEVICE)
    model = TinyHead(h, v, OPTION_CASES["mixed"].options.as_kwargs()).to(DEVICE)
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for fn in (model, compiled):
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = fn(x, target)
        loss.backward()
        assert model.lm_head.weight.grad.dtype == torch.float32
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    for i, (eager, comp) in enumerate(zip(*results)):
        err = relative_error(comp, eager)
        assert err <= 1e-2, f"output {i}: compiled vs eager relative difference {err:.3g}"


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_no_host_synchronisation_in_forward_and_backward(reduction):
    case = OPTION_CASES["mixed"]
    hidden, weight, target, bias = make_inputs(
        *GPT2_HEAD, seed=seed_for("gpu-sync", reduction), with_bias=True, ignore_fraction=case.ignore_fraction,
        device=DEVICE,
    )
    hidden, weight, bias = cast_inputs(hidden, weight, bias, torch.bfloat16, torch.float32)
    upstream = torch.randn(target.shape, device=DEVICE) if reduction == "none" else None
    options = {**case.options.as_kwargs(), "reduction": reduction}

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = fused_triton(hidden, weight, target, bias, **options)
        loss.backward(upstream)

    step()  # compilation and autotuning may synchronise; the steady state must not
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_out_of_range_targets_on_cuda():
    """No sync by default, so a bad target yields NaN at that token; validate_targets=True raises."""
    hidden, weight, target, _ = make_inputs(64, 32, 101, seed=seed_for("gpu-range"), device=DEVICE)
    target[7] = 101
    with pytest.raises(IndexError, match="target"):
        fused_triton(hidden, weight, target, validate_targets=True)
    per_token = fused_triton(hidden, weight, target, reduction="none")
    assert torch.isnan(per_token[7]) and torch.isfinite(per_token[:7]).all() and torch.isfinite(per_token[8:]).all()


def measured_peak_extra(step, *leaves) -> int:
    """ANCHORS protocol: one warm-up ``step()`` (compilation, autotuning, allocator pools), then
    the bytes one more ``step()`` allocates above the baseline at its peak (gradients included)."""
    from fusedce_profiler.instrument.protocol import MemoryMeter, settle, synchronize

    step()
    for leaf in leaves:
        leaf.grad = None
    settle("cuda")
    with MemoryMeter("cuda") as meter:
        meter.mark("step")
        step()
        synchronize("cuda")
    return meter.record.extra()


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "amp"])
def test_peak_memory_stays_far_below_the_logits(record_property, weight_dtype):
    """ANCHORS protocol: peak extra over the baseline, gradients included, at N = 16384, V = 131072.

    Beyond the gradients themselves (the floor), temporaries must stay under an eighth of
    the N×V bf16 logits (N·V·2/8 = 512 MiB here).
    """
    n, h, v = 16384, 1024, 131072
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("gpu-memory", weight_dtype), device=DEVICE)
    hidden, weight, _ = cast_inputs(hidden, weight, None, torch.bfloat16, weight_dtype)
    autocast = weight_dtype == torch.float32

    def step():
        hidden.grad = weight.grad = None
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            loss = fused_triton(hidden, weight, target)
        loss.backward()

    peak_extra = measured_peak_extra(step, hidden, weight)
    floor = n * h * hidden.element_size() + v * h * weight.element_size()
    logits_bf16 = n * v * 2
    record_property("peak_extra_bytes", peak_extra)
    record_property("floor_bytes", floor)
    assert peak_extra - floor < logits_bf16 / 8, (
        f"peak extra {peak_extra / 2**20:.0f} MiB = floor {floor / 2**20:.0f} MiB + "
        f"{(peak_extra - floor) / 2**20:.0f} MiB of temporaries (N·V·2/8 = {logits_bf16 / 8 / 2**20:.0f} MiB)"
    )


@pytest.mark.parametrize("moved", ["weight", "target"])
def test_inputs_split_between_cuda_and_cpu_name_the_device(moved):
    hidden, weight, target, _ = make_inputs(8, 16, 32, seed=seed_for("gpu-devices"), device=DEVICE)
    inputs = {"hidden": hidden, "weight": weight, "target": target}
    inputs[moved] = inputs[moved].detach().cpu()
    with pytest.raises((ValueError, TypeError), match=rf"{moved}|device"):
        fusedce.linear_cross_entropy(inputs["hidden"], inputs["weight"], inputs["target"])


def test_triton_impl_on_cpu_tensors_without_the_interpreter_names_impl(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    hidden, weight, target, _ = make_inputs(8, 16, 32, seed=seed_for("gpu-cpu-triton"))
    with pytest.raises((ValueError, TypeError), match="impl"):
        fusedce.linear_cross_entropy(hidden, weight, target, impl="triton")


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "amp"])
def test_users_head_with_ignored_targets_is_as_accurate_as_eager(record_property, weight_dtype):
    """The user's head (V = 32777: a ragged last vocabulary chunk), mean over 30 % ignored targets."""
    n, h, v = 8192, 768, 32777
    options = LossOptions(ignore_index=-100)
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("gpu-user-head", weight_dtype), device=DEVICE,
                                            ignore_fraction=0.3)
    hidden, weight, _ = cast_inputs(hidden, weight, None, torch.bfloat16, weight_dtype)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=weight_dtype == torch.float32):
        fused = run_fused(fused_triton, hidden, weight, target, None, 1.0)
        eager = run_fused(eager_loss, hidden, weight, target, None, 1.0)
    ref = chunked_reference_linear_cross_entropy(hidden, weight, target, None, options, 1.0, rows_per_chunk=512)
    assert_within_eager_error(record_property, fused, eager, ref, SLACK[torch.bfloat16])


@pytest.mark.parametrize("weight_dtype,budget", [(torch.bfloat16, None), (torch.float32, None),
                                                 (torch.bfloat16, "fast")], ids=["bf16", "amp", "bf16-fast-kept"])
def test_memory_model_predicts_the_measured_peak(record_property, weight_dtype, budget):
    """fusedce.memory_model against max_memory_allocated at the user's head (within 2 MiB); in bf16
    under ``"fast"`` at H = 2048 the plan keeps logits from the forward (fusedce/kept_plan.py)."""
    from fusedce.memory_model import predict_peak_bytes

    n, h, v = (4096, 2048, 32777) if budget == "fast" else (8192, 768, 32777)
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("gpu-model", weight_dtype), device=DEVICE)
    hidden, weight, _ = cast_inputs(hidden, weight, None, torch.bfloat16, weight_dtype)

    def step():
        hidden.grad = weight.grad = None
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=weight_dtype == torch.float32):
            loss = fused_triton(hidden, weight, target, memory_budget=budget)
        loss.backward()

    measured = measured_peak_extra(step, hidden, weight)
    prediction = predict_peak_bytes(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=weight_dtype,
                                    compute_dtype=torch.bfloat16, memory_budget=budget)
    assert bool(prediction.plan.kept_cols) == (budget == "fast"), prediction.plan
    predicted = prediction.step
    record_property("measured_bytes", measured)
    record_property("predicted_bytes", predicted)
    assert abs(predicted - measured) <= 2 * 2**20, (predicted, measured)


def test_memory_model_predicts_a_split_backwards_measured_peak(record_property):
    """A bf16 head whose one pass would hold twice its budget: the backward in two passes
    (fusedce/split_plan.py), predicted within 2 MiB, below the one-pass plan's measured peak."""
    from fusedce.memory_model import predict_peak_bytes

    n, h, v = 8192, 768, 32777
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("gpu-split"), device=DEVICE,
                                            dtype=torch.bfloat16)
    peaks = {}
    for name, budget in (("split", 8 << 20), ("one pass", None)):
        def step():
            hidden.grad = weight.grad = None
            fused_triton(hidden, weight, target, memory_budget=budget).backward()

        prediction = predict_peak_bytes(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                                        compute_dtype=torch.bfloat16, memory_budget=budget)
        assert bool(prediction.plan.hidden_rows) == (name == "split"), prediction.plan
        peaks[name] = measured = measured_peak_extra(step, hidden, weight)
        record_property(f"{name}_measured_bytes", measured)
        record_property(f"{name}_predicted_bytes", prediction.step)
        assert abs(prediction.step - measured) <= 2 * 2**20, (name, prediction, measured)
    assert peaks["split"] < peaks["one pass"]


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "amp"])
def test_in_place_bf16_logit_grads_over_long_rows_match_the_torch_path(record_property, weight_dtype):
    """With a bf16 compute dtype, ``logit_grad`` writes the gradients over the fp32 logits they
    are computed from (``IN_PLACE_NARROW``), and only a barrier after each iteration's loads
    keeps one warp's stores off logits that other warps have not loaded yet.

    Sized for that race: one vocabulary chunk of V = 65537 columns, so each of the 8192 row
    programs (8 warps each) walks 33 iterations of BLOCK_V = 2048 over its row. Logits
    overwritten before they are read would corrupt those rows' gradients (and make runs
    differ). Three runs must be bitwise identical; the gradients must match impl="torch" (the
    same precision and loop, with PyTorch math that does not overwrite in place) row by row,
    and the float64 reference as closely as impl="torch" does.
    """
    n, h, v = 8192, 128, 65537
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("gpu-in-place", weight_dtype), logit_std=1.0,
                                            device=DEVICE)
    hidden, weight, _ = cast_inputs(hidden, weight, None, torch.bfloat16, weight_dtype)
    options = {"reduction": "sum", "vocab_chunk_size": v}
    autocast = weight_dtype == torch.float32
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        runs = [run_fused(fused_triton, hidden, weight, target, None, 1.0, **options) for _ in range(3)]
        torch_path = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, None, 1.0, impl="torch",
                               **options)
    for run in runs[1:]:
        for field in ("grad_hidden", "grad_weight"):
            assert torch.equal(getattr(run, field), getattr(runs[0], field)), f"{field} differs between runs"
    fused = runs[0]
    for field in ("grad_hidden", "grad_weight"):
        got, want = getattr(fused, field).double(), getattr(torch_path, field).double()
        worst = ((got - want).norm(dim=1) / want.norm(dim=1)).max().item()
        record_property(f"{field}_worst_row_rel_diff_vs_torch_path", f"{worst:.3e}")
        assert worst <= 1e-2, f"{field}: a row differs from impl='torch' by {worst:.3g} (relative)"
    ref = chunked_reference_linear_cross_entropy(hidden, weight, target, None, LossOptions(reduction="sum"), 1.0,
                                                 rows_per_chunk=512)
    assert_within_eager_error(record_property, fused, torch_path, ref, SLACK[torch.bfloat16])


@pytest.mark.parametrize("budget", [None, "fast", "min"])
def test_a_bf16_weight_gradient_is_one_rounding_whatever_the_block_width(budget):
    """PyTorch lets cuBLAS sum a bf16 product's split-K partials in bf16 (on by default): the default's
    grad_weight at 8192×768×32777 had 0.00174 against one rounding's 0.00166, ``"fast"`` 0.00185. The
    products that write a 2-byte gradient turn it off; the error is that of one rounding of the
    float64 gradient, with the switch left on as a training script leaves it."""
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    n, h, v = 8192, 768, 32777
    hidden = torch.randn(n, h, device=DEVICE, generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(v, h, device=DEVICE, generator=gen) * h ** -0.5).bfloat16().requires_grad_()
    target = torch.randint(0, v, (n,), device=DEVICE, generator=gen)
    fused_triton(hidden, weight, target, memory_budget=budget).backward()
    ref = chunked_reference_linear_cross_entropy(hidden, weight, target)
    one_rounding = relative_error(ref.grad_weight.bfloat16(), ref.grad_weight)
    assert relative_error(weight.grad, ref.grad_weight) <= 1.01 * one_rounding
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction  # restored
