"""The backward in two passes (fusedce/split_plan.py): where the planner takes it, and that it is
exact, as small as modelled, and compiles.

A split plan is made here with an explicit byte budget at N > 1024 tokens (the split's row chunks
are at least 1024 rows), a bf16 or fp16 weight (an fp32 weight's gradient is summed over row
chunks in place, so it never needs a split).
"""
from __future__ import annotations

import pytest
import torch

import fusedce
from fusedce.memory_model import predict_peak_bytes
from fusedce.block_sizes import narrowest_cols
from fusedce.planner import ChunkPlan, plan_chunks
from fusedce.split_plan import SPLIT_TIME_FACTOR
from fusedce.time_model import step_seconds
from fusedce_profiler.instrument.protocol import MemoryMeter, settle
from reference import OPTION_CASES, make_inputs, reference_linear_cross_entropy, relative_error, run_fused, seed_for

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
N, H, V = 2100, 16, 1500  # three balanced row chunks of the grad_hidden pass (704, 704, 692)
SPLIT_BUDGET = 100_000  # bytes: far below one pass's N·H·4 + N·1024·4
ONE_PASS_BUDGET = 1 << 30


def _plan(n, h, v, dtype, **options):
    return plan_chunks(n, h, v, hidden_dtype=dtype, weight_dtype=dtype, compute_dtype=dtype, scalar_loss=True,
                       needs_grad=True, cuda=True, sm_count=132, tiled=True, **options)


def test_the_planner_splits_where_one_pass_holds_twice_the_budget():
    """Llama-3's head at 32768 tokens in bf16: one pass holds its 512 MiB grad_hidden sum, 2.6 × the
    default budget, so default and "min" split; at 8192 tokens the default's one pass fits and is
    kept, "min" splits (its 5 % budget); an fp32 weight, ``chunk_size`` and ``per_chunk`` never do."""
    big = _plan(32768, 4096, 128256, BF16)
    assert big.hidden_rows and big.hidden_rows < 32768 and big.rows == 32768
    assert _plan(32768, 4096, 128256, BF16, memory_budget="min").hidden_rows
    assert _plan(8192, 4096, 128256, BF16).hidden_rows == 0
    assert _plan(8192, 4096, 128256, BF16, memory_budget="min").hidden_rows
    assert _plan(16384, 3584, 152064, BF16).hidden_rows == 0  # one pass holds 1.2 × the budget: kept
    amp = plan_chunks(32768, 4096, 128256, hidden_dtype=BF16, weight_dtype=F32, compute_dtype=BF16, cuda=True)
    assert amp.hidden_rows == 0
    assert _plan(32768, 4096, 128256, BF16, chunk_size=4096).hidden_rows == 0
    assert _plan(32768, 4096, 128256, BF16, grad_weight_accumulation="per_chunk").hidden_rows == 0
    assert _plan(8192, 768, 32777, BF16, memory_budget="min").hidden_rows == 0  # host-bound: not within time


@pytest.mark.parametrize("n, h, v, budget", [(32768, 4096, 128256, 1.25), (8192, 5120, 131072, 1.1),
                                             (8192, 4096, 128256, 1.1)])
def test_a_budget_in_numbers_splits_wherever_one_pass_exceeds_it(n, h, v, budget):
    """A multiple of the floor is the caller's number: where one pass holds between 1 and 2 × it (the
    named budgets' rule keeps one pass there), the backward splits and the modelled peak meets it —
    Llama-3's head at 32768 tokens asked for 1.25 × peaked at 1.458 × with one pass (measured on an
    H200, the modelled one-pass peaks before: 1.458, 1.130, 1.135 ×); the default budget keeps one pass."""
    floor = 2 * (n * h + v * h)
    plan = _plan(n, h, v, BF16, memory_budget=budget)
    peak = predict_peak_bytes(n, h, v, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                              memory_budget=budget, sm_count=132, tiled=True)
    assert plan.hidden_rows and peak.plan == plan
    assert peak.step <= budget * floor
    narrowest_one_pass = predict_peak_bytes(n, h, v, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                                            chunk_size=n, vocab_chunk_size=1024, sm_count=132, tiled=True)
    assert narrowest_one_pass.plan.hidden_rows == 0 and narrowest_one_pass.step > budget * floor
    assert _plan(8192, 5120, 131072, BF16).hidden_rows == 0  # the default's one pass fits its own budget


def test_a_split_costs_one_more_logits_pass_in_the_time_model():
    """10·N·H·V FLOPs instead of 8: at Llama-3's head the split's modelled time is 1.2–1.3 × one pass's."""
    n, h, v = 32768, 4096, 128256
    split = _plan(n, h, v, BF16)
    one_pass = ChunkPlan(rows=split.rows, cols=split.cols, tiled=True)
    ratio = step_seconds(n, h, v, split, convert_weight=False) / step_seconds(n, h, v, one_pass,
                                                                              convert_weight=False)
    assert 1.2 < ratio < 1.3, ratio


@pytest.mark.parametrize("case", ["plain", "ignored_targets", "label_smoothing", "z_loss", "softcap", "mixed"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_split_gradients_are_as_exact_as_one_pass(case, dtype):
    """Both passes' gradients against float64: grad_weight is the one-pass plan's bit for bit (the same
    N-row blocks, each vocabulary chunk written once), grad_hidden and grad_bias within the one-pass
    plan's error (one rounding of an fp32 sum each)."""
    spec = OPTION_CASES[case]
    hidden, weight, target, bias = make_inputs(N, H, V, seed=seed_for("split", case, dtype), dtype=dtype,
                                               with_bias=spec.with_bias, ignore_fraction=spec.ignore_fraction,
                                               ignore_index=spec.options.ignore_index)
    options = dict(ignore_index=spec.options.ignore_index, label_smoothing=spec.options.label_smoothing,
                   z_loss=spec.options.z_loss, softcap=spec.options.softcap, impl="torch", vocab_chunk_size=512)
    plan = _plan(N, H, V, dtype, memory_budget=SPLIT_BUDGET, vocab_chunk_size=512)
    assert plan.hidden_rows == 704 and plan.cols == plan.hidden_cols == 512
    split = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, memory_budget=SPLIT_BUDGET,
                      **options)
    one = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, memory_budget=ONE_PASS_BUDGET,
                    **options)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, spec.options)
    assert torch.equal(split.loss, one.loss)
    assert torch.equal(split.grad_weight, one.grad_weight)
    for name in ("grad_hidden",) + (("grad_bias",) if bias is not None else ()):
        got, base, ref = getattr(split, name), getattr(one, name), getattr(want, name)
        assert relative_error(got, ref) <= 1.05 * relative_error(base, ref) + 1e-7, name


@pytest.mark.parametrize("frozen", ["weight", "hidden"])
def test_a_split_plan_with_one_gradient_runs_only_its_pass(frozen):
    hidden, weight, target, bias = make_inputs(N, H, V, seed=seed_for("split-one", frozen), dtype=BF16,
                                               with_bias=True)
    (weight if frozen == "weight" else hidden).requires_grad_(False)
    got = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, impl="torch",
                    memory_budget=SPLIT_BUDGET)
    want = reference_linear_cross_entropy(hidden, weight, target, bias)
    for name in ("grad_hidden", "grad_weight", "grad_bias"):
        if getattr(want, name) is None:
            assert getattr(got, name) is None, name
        else:
            assert relative_error(getattr(got, name), getattr(want, name)) < 2e-2, name


def _step_peak(hidden, weight, target, bias, **options) -> int:
    """Peak extra bytes of one forward+backward on the CPU, inputs allocated before."""
    for leaf in (hidden, weight, bias):
        if leaf is not None:
            leaf.grad = None
    settle("cpu")
    with MemoryMeter("cpu") as meter:
        meter.mark("forward")
        loss = fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", **options)
        meter.mark("backward")
        loss.backward()
    return meter.record.peak_bytes


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_memory_model_predicts_a_split_plans_measured_cpu_peak(bias):
    """The larger of the two passes, within 5 %, and below the one-pass plan's peak by about its
    grad_hidden sum (N·H·4 against 704·H·4)."""
    n, h, v = 2100, 256, 600
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(n, h, generator=gen).to(BF16).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) * h ** -0.5).to(BF16).requires_grad_()
    b = torch.zeros(v, dtype=BF16).requires_grad_() if bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    peaks = {}
    for name, budget in (("split", 1_000_000), ("one pass", None)):
        prediction = predict_peak_bytes(n, h, v, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                                        has_bias=bias, bias_dtype=BF16 if bias else None, impl="torch",
                                        memory_budget=budget, vocab_chunk_size=128)
        assert prediction.plan.hidden_rows == (704 if name == "split" else 0)
        measured = _step_peak(hidden, weight, target, b, memory_budget=budget, vocab_chunk_size=128)
        assert abs(prediction.step - measured) <= 0.05 * measured, (name, prediction, measured)
        peaks[name] = measured
    assert peaks["one pass"] - peaks["split"] >= 0.9 * (n - 704) * h * 4, peaks


def test_a_split_plan_compiles_fullgraph_and_matches_eager():
    torch._dynamo.reset()
    hidden, weight, target, bias = make_inputs(N, H, V, seed=11, dtype=BF16, with_bias=True)

    def loss_fn(hidden, weight, target, bias):
        return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", memory_budget=SPLIT_BUDGET,
                                            validate_targets=False)

    eager = run_fused(loss_fn, hidden, weight, target, bias)
    compiled = run_fused(torch.compile(loss_fn, fullgraph=True, backend="eager"), hidden, weight, target, bias)
    for name in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(eager, name), getattr(compiled, name)), name


@pytest.mark.parametrize("n, h, v, one_pass_peak", [(8192, 2304, 256000, 1.076), (32768, 4096, 128256, 1.0515)])
def test_min_meets_its_five_percent_where_a_split_within_its_time_cap_can(n, h, v, one_pass_peak):
    """``"min"`` splits wherever one pass exceeds its budget (not only at twice it, the default's rule)
    and keeps the split within SPLIT_TIME_FACTOR of the default's modelled time. Gemma-2's head in bf16:
    one pass held its 72 MiB grad_hidden sum, 1.076 × the floor (measured on an H200: 1.077 ×); at
    Llama-3's head at 32768 tokens the split's grad_weight pass, held to 1024-column blocks of 32768
    rows (64 MiB against a 61.7 MiB budget), 1.0515 × (measured 1.051 ×): narrower blocks hold as
    many logits there (``narrowest_cols``)."""
    floor = 2 * (n * h + v * h)
    peak = predict_peak_bytes(n, h, v, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                              memory_budget="min", sm_count=132, tiled=True)
    assert peak.plan.hidden_rows and peak.step <= 1.05 * floor < one_pass_peak * floor
    default = _plan(n, h, v, BF16)
    seconds = [step_seconds(n, h, v, plan, convert_weight=False) for plan in (peak.plan, default)]
    assert seconds[0] <= SPLIT_TIME_FACTOR * seconds[1]


def test_the_narrowest_block_holds_as_many_logits_beyond_16384_rows():
    """1024 columns up to 16384 rows (the default plans there are unchanged: Qwen2.5-7B's head at
    16384 tokens in bf16 keeps its 1024-column blocks), then the logits of 16384 × 1024, in multiples
    of 128 and never under one 256-column tile; never wider than the vocabulary."""
    assert [narrowest_cols(rows, 128256) for rows in (1, 1024, 8192, 16384, 20000, 32768, 65536, 10**6)] \
        == [1024, 1024, 1024, 1024, 896, 512, 256, 256]
    assert narrowest_cols(32768, 300) == 300 and narrowest_cols(100, 700) == 700
    assert _plan(16384, 3584, 152064, BF16).cols == 1024
