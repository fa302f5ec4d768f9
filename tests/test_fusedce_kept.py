"""Logits kept from the forward for the backward (``fusedce/kept_plan.py``).

Where the planner keeps logits (an explicit budget, all in bf16, on CUDA), and what it costs:
the plan fits its budget in the memory model and the time model counts the saved products.
The passes with kept logits against the float64 reference on ragged sizes with every option,
on the PyTorch path and (``TRITON_INTERPRET=1``) the Triton path: the planner's plan is
replaced by one that keeps logits, since on the CPU it never does. A second backward through
the same graph reads the same logits. On a GPU, ``tests/test_fusedce_gpu.py`` runs the planned
``"fast"`` budget itself (parity with eager, determinism, the measured peak).
"""
import dataclasses
import importlib.util
import os

import pytest
import torch

import fusedce
from fusedce import api, passes, time_model
from fusedce.memory_model import predict_peak_bytes
from fusedce.options import LossOptions as FusedOptions
from fusedce.planner import ChunkPlan, budget_bytes, gradient_floor_bytes, plan_chunks
from fusedce.time_model import step_seconds
from reference import (
    OPTION_CASES,
    LossOptions,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    relative_error,
    run_fused,
    seed_for,
)

BF16 = torch.bfloat16
FIELDS = ("loss", "grad_hidden", "grad_weight", "grad_bias")
HEADS = {"phi3": (8192, 3072, 32064), "llama3": (8192, 4096, 128256), "nemo": (8192, 5120, 131072)}
SMALL_HEAD = (8192, 768, 32777)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton path: compiled, or interpreted on the CPU

TRITON = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or (not torch.cuda.is_available()
                                                   and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="the Triton path needs CUDA or TRITON_INTERPRET=1")


def _plan(n, h, v, budget="fast", **overrides):
    args = dict(hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16, memory_budget=budget, scalar_loss=True,
                needs_grad=True, cuda=True, sm_count=132, tiled=True)
    return plan_chunks(n, h, v, **{**args, **overrides})


@pytest.mark.parametrize("head", list(HEADS))
def test_fast_keeps_logits_in_bf16_on_cuda_within_its_budget(head):
    """``"fast"`` at these bf16 heads recomputes (no precompute fits), so it keeps logits: the default
    plan's blocks plus K columns, and the modelled peak stays within the budget over the floor."""
    n, h, v = HEADS[head]
    plan, default = _plan(n, h, v), _plan(n, h, v, budget=None)
    assert plan.strategy == "recompute" and plan.kept_cols > 0, plan
    assert (plan.rows, plan.cols, plan.tiled) == (default.rows, default.cols, default.tiled)
    assert plan.kept_cols % 128 == 0 and plan.kept_cols <= v
    floor = gradient_floor_bytes(n, h, v, BF16, BF16)
    budget = budget_bytes("fast", floor=floor, n=n, v=v, compute_dtype=BF16)
    peak = predict_peak_bytes(n, h, v, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                              memory_budget="fast", sm_count=132, tiled=True)
    assert peak.plan == plan
    assert peak.step <= floor + budget + 40 * n, (peak, floor, budget)


@pytest.mark.parametrize("change", [
    {"budget": None}, {"budget": "min"}, {"tiled": False}, {"weight_dtype": torch.float32},
    {"hidden_dtype": torch.float32}, {"compute_dtype": torch.float16, "hidden_dtype": torch.float16,
                                      "weight_dtype": torch.float16},
    {"strategy": "recompute"}, {"chunk_size": 4096}, {"vocab_chunk_size": 8192}, {"needs_grad": False},
    {"head": SMALL_HEAD},
], ids=lambda change: "-".join(f"{k}={v}" for k, v in change.items()))
def test_logits_are_kept_only_where_the_conditions_hold(change):
    """Not under the default or ``"min"`` budget (nothing held from the forward), not off the tiled
    Triton path (the PyTorch path would widen each kept block into one more fp32 block), not
    for a converted weight or hidden, not in fp16 (its logits could overflow), not where the strategy or
    the chunk sizes are asked for by name, not without gradients, not at a small head (H < 2048)."""
    change = dict(change)
    n, h, v = change.pop("head", HEADS["llama3"])
    assert _plan(n, h, v, **{"budget": change.pop("budget", "fast"), **change}).kept_cols == 0


def test_a_budget_too_small_for_a_block_of_kept_columns_keeps_none():
    n, h, v = HEADS["phi3"]
    small, large = _plan(n, h, v, budget=1.2), _plan(n, h, v, budget=2.0)
    assert small.kept_cols == 0 and large.kept_cols > 0, (small, large)


def test_column_chunks_break_at_the_kept_columns():
    plan = ChunkPlan(rows=8, cols=32, kept_cols=80)
    assert plan.col_chunks(131) == [(0, 32), (32, 64), (64, 80), (80, 112), (112, 131)]
    assert plan.col_chunks(131, start=80) == [(80, 112), (112, 131)]
    assert plan.col_chunks(131, start=100) == [(100, 131)]
    assert ChunkPlan(rows=8, cols=32, kept_cols=200).col_chunks(40) == [(0, 32), (32, 40)]


def test_the_time_model_counts_the_products_kept_logits_save():
    n, h, v = HEADS["llama3"]
    plan = _plan(n, h, v)
    without = dataclasses.replace(plan, kept_cols=0)
    # one product of 2·N·K·H FLOPs, and 22 − 12 bytes a kept logit (time_model's docstring), at the model's rates
    kept_logits = n * plan.kept_cols
    saved = 2 * kept_logits * h / time_model.GEMM_FLOPS_PER_S + 10 * kept_logits / time_model.HBM_BYTES_PER_S
    gain = step_seconds(n, h, v, without, convert_weight=False) - step_seconds(n, h, v, plan, convert_weight=False)
    assert gain == pytest.approx(saved, rel=0.02)


def _keeping(monkeypatch, kept_cols: int, cols: int = 32):
    """Make the planner's plan (any budget) a recompute plan of ``cols`` columns keeping ``kept_cols``."""
    planned = api.plan_chunks

    def plan_with_kept(*args, **kwargs):
        plan = planned(*args, **kwargs)
        return dataclasses.replace(plan, strategy="recompute", cols=cols, kept_cols=kept_cols, split_k=1,
                                   hidden_rows=0, hidden_cols=0)

    monkeypatch.setattr(api, "plan_chunks", plan_with_kept)


def _run(monkeypatch, kept_cols, case, reduction, impl, seed, n=37, h=40, v=131):
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(n, h, v, seed=seed, with_bias=case.with_bias,
                                               ignore_fraction=case.ignore_fraction,
                                               ignore_index=options.ignore_index, dtype=BF16,
                                               device=DEVICE if impl == "triton" else "cpu")
    upstream = make_upstream(target, reduction, seed + 1)
    _keeping(monkeypatch, kept_cols)
    got = run_fused(fusedce.linear_cross_entropy, hidden, weight, target, bias, upstream, impl=impl,
                    **options.as_kwargs())
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    return got, want


def _kept_cases():
    """Every case on the PyTorch path; on the Triton path (interpreted on the CPU: slow) the two that
    take every option between them."""
    for case_name, reduction in (("plain", "mean"), ("mixed", "mean"), ("mixed", "none"), ("softcap", "sum"),
                                 ("bias", "mean")):
        yield pytest.param("torch", case_name, reduction, id=f"torch-{case_name}-{reduction}")
        if (case_name, reduction) in (("mixed", "none"), ("softcap", "sum")):
            yield pytest.param("triton", case_name, reduction, marks=TRITON, id=f"triton-{case_name}-{reduction}")


@pytest.mark.parametrize("impl,case_name,reduction", list(_kept_cases()))
def test_kept_logits_match_the_reference_as_closely_as_recomputed_ones(monkeypatch, impl, case_name, reduction):
    """N = 37, V = 131 in chunks of 32 columns, the first 80 kept: chunks [64, 80) and [112, 131) are
    ragged. Each field's error against float64 is within bf16's and at most 1.5 × (+ 1e-3) that of
    the same plan keeping nothing."""
    case = OPTION_CASES[case_name]
    seed = seed_for("kept", case_name, reduction, impl)
    kept, want = _run(monkeypatch, 80, case, reduction, impl, seed)
    recomputed, _ = _run(monkeypatch, 0, case, reduction, impl, seed)
    for field in FIELDS:
        if getattr(want, field) is None:
            continue
        err, base = relative_error(getattr(kept, field), getattr(want, field)), \
            relative_error(getattr(recomputed, field), getattr(want, field))
        assert err <= 1e-2 and err <= 1.5 * base + 1e-3, (field, err, base)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=TRITON)])
def test_every_column_kept_matches_the_reference(monkeypatch, impl):
    case = OPTION_CASES["mixed"]
    kept, want = _run(monkeypatch, 131, case, "mean", impl, seed_for("kept-all", impl))
    for field in FIELDS:
        if getattr(want, field) is not None:
            assert relative_error(getattr(kept, field), getattr(want, field)) <= 1e-2, field


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=TRITON)])
def test_a_second_backward_reads_the_same_kept_logits(monkeypatch, impl):
    """retain_graph: the backward writes its gradients into the block buffer, never over the kept
    logits, so a second backward through the same graph returns the same gradients."""
    hidden, weight, target, bias = make_inputs(37, 40, 131, seed=seed_for("kept-twice", impl), with_bias=True,
                                               ignore_fraction=0.2, dtype=BF16,
                                               device=DEVICE if impl == "triton" else "cpu")
    _keeping(monkeypatch, 96)
    loss = fusedce.linear_cross_entropy(hidden, weight, target, bias, impl=impl, label_smoothing=0.1)
    first = torch.autograd.grad(loss, (hidden, weight, bias), retain_graph=True)
    second = torch.autograd.grad(loss, (hidden, weight, bias))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_the_passes_refuse_kept_logits_they_cannot_keep():
    """Kept logits need the weight in the compute dtype (a converted weight chunk is not kept) and
    an (N, K ≤ V) tensor of that dtype."""
    hidden = torch.randn(8, 16, dtype=BF16)
    weight = torch.randn(40, 16)
    target = torch.randint(0, 40, (8,))
    from fusedce import block_math_torch

    plan = ChunkPlan(rows=8, cols=16)
    for w, kept in ((weight, torch.empty(8, 16, dtype=BF16)), (weight.to(BF16), torch.empty(8, 48, dtype=BF16)),
                    (weight.to(BF16), torch.empty(8, 16))):
        with pytest.raises(ValueError, match="kept logits"):
            passes.forward(hidden, w, target, None, FusedOptions(), BF16, plan, block_math_torch, kept=kept)


def test_the_kept_logits_are_held_once(monkeypatch):
    """The kept logits are the op's third output: autograd must not hand the backward a zero gradient
    of their size (a second copy; measured on an H200 before the op stopped materialising output
    gradients: 1.51 GiB above the plan at Llama-3). The step's CPU peak grows by the kept bytes once."""
    from fusedce_profiler.instrument.protocol import MemoryMeter, settle

    n, h, v, kept_cols = 1024, 32, 4096, 2048
    hidden, weight, target, _ = make_inputs(n, h, v, seed=seed_for("kept-once"), dtype=BF16)

    def peak(kept: int) -> int:
        _keeping(monkeypatch, kept, cols=256)
        hidden.grad = weight.grad = None
        settle("cpu")
        with MemoryMeter("cpu") as meter:
            meter.mark("step")
            fusedce.linear_cross_entropy(hidden, weight, target, impl="torch").backward()
        return meter.record.peak_bytes

    kept_bytes = n * kept_cols * 2
    growth = peak(kept_cols) - peak(0)
    assert 0.8 * kept_bytes <= growth <= 1.5 * kept_bytes, (growth, kept_bytes)


def test_a_plan_with_kept_logits_compiles_fullgraph_and_matches_eager(monkeypatch):
    """The op's third output (the kept logits, saved for the backward) traces under a fullgraph compile."""
    torch._dynamo.reset()
    hidden, weight, target, bias = make_inputs(37, 40, 131, seed=seed_for("kept-compile"), with_bias=True,
                                               ignore_fraction=0.2, dtype=BF16)
    _keeping(monkeypatch, 80)

    def loss_fn(hidden, weight, target, bias):
        return fusedce.linear_cross_entropy(hidden, weight, target, bias, impl="torch", validate_targets=False)

    eager = run_fused(loss_fn, hidden, weight, target, bias)
    compiled = run_fused(torch.compile(loss_fn, fullgraph=True, backend="eager"), hidden, weight, target, bias)
    for name in FIELDS:
        assert torch.equal(getattr(eager, name), getattr(compiled, name)), name
    torch._dynamo.reset()
