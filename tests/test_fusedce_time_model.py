"""The planner's time model and the two budgets it shapes: "min" within the default's time,
"fast" below torch.compile's memory. Pure arithmetic on shapes (no GPU, no tensors)."""
from __future__ import annotations

import pytest
import torch

from fusedce.memory_model import predict_peak_bytes
from fusedce.planner import (ALLOCATOR_SLACK_BYTES, ChunkPlan, MIN_PLANNED_TIME_FACTOR, default_budget_bytes,
                             gradient_floor_bytes, plan_chunks)
from fusedce.split_plan import SPLIT_TIME_FACTOR
from fusedce.time_model import HOST_S_PER_BLOCK_PASS, step_seconds

ANCHOR_ROWS = [(8192, 768, 32777), (8192, 2304, 256000), (8192, 4096, 128256), (32768, 4096, 128256)]
MODES = {"amp": torch.float32, "bf16": torch.bfloat16}


def _plan(n, h, v, weight_dtype, budget):
    return plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=weight_dtype, compute_dtype=torch.bfloat16,
                       memory_budget=budget, scalar_loss=True, needs_grad=True, cuda=True, sm_count=132)


def _peak(n, h, v, weight_dtype, budget):
    return predict_peak_bytes(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=weight_dtype,
                              compute_dtype=torch.bfloat16, memory_budget=budget, sm_count=132).step


def _seconds(n, h, v, weight_dtype, plan):
    return step_seconds(n, h, v, plan, convert_weight=weight_dtype != torch.bfloat16)


def test_many_small_blocks_cost_the_host_time_of_each():
    """1024 blocks of 64 × 64 are bound by the host: at least 2 passes × the per-block cost each,
    and slower than one block of the same logits."""
    n, h, v = 2048, 768, 2048
    small = ChunkPlan(rows=64, cols=64)
    one = ChunkPlan(rows=n, cols=v)
    assert step_seconds(n, h, v, small, convert_weight=False) >= 1024 * 2 * HOST_S_PER_BLOCK_PASS
    assert step_seconds(n, h, v, small, convert_weight=False) > 10 * step_seconds(n, h, v, one, convert_weight=False)


def test_ragged_chunks_are_counted_once_each():
    """V = 1000 in chunks of 300: three full chunks and one of 100 — the same as listing them."""
    plan = ChunkPlan(rows=7, cols=300)
    listed = sum(1 for _ in plan.row_chunks(20)) * sum(1 for _ in plan.col_chunks(1000))
    assert listed == 3 * 4
    fewer = ChunkPlan(rows=20, cols=1000)
    assert step_seconds(20, 8, 1000, plan, convert_weight=False) >= listed * 2 * HOST_S_PER_BLOCK_PASS
    assert step_seconds(20, 8, 1000, fewer, convert_weight=False) < step_seconds(20, 8, 1000, plan,
                                                                                 convert_weight=False)


@pytest.mark.parametrize("mode", ["amp", "bf16"])
def test_min_stays_within_the_default_time_at_the_users_head(mode):
    """At 8192×768×32777, 5 % of the floor left 264 blocks of 1157 × 1024 in amp (86 ms on an
    H200 against the default's 8.8 ms): "min" now takes a plan that models within 1.2 × the
    default's time, and still holds less than the default."""
    n, h, v = 8192, 768, 32777
    weight_dtype = MODES[mode]
    small, default = _plan(n, h, v, weight_dtype, "min"), _plan(n, h, v, weight_dtype, None)
    assert _seconds(n, h, v, weight_dtype, small) <= MIN_PLANNED_TIME_FACTOR * _seconds(n, h, v, weight_dtype, default)
    assert _peak(n, h, v, weight_dtype, "min") < _peak(n, h, v, weight_dtype, None)


@pytest.mark.parametrize("n,h,v", [(8192, 4096, 128256), (8192, 2304, 256000), (32768, 4096, 128256),
                                   (16384, 3584, 152064)])
@pytest.mark.parametrize("mode", ["amp", "bf16"])
def test_min_keeps_five_percent_of_the_floor_at_the_large_heads(n, h, v, mode):
    """Where blocks of ≥ 1024 × 1024 are large enough for the GPU (the tiled kernels' blocks, as on a
    Hopper GPU), the time cap changes nothing, and the modelled peak leaves the caching allocator's slack
    below 1.05 × floor: at 16384×3584×152064 in amp a plan modelled 0.7 MiB below it measured 0.1 MiB
    above (a whole cached block counted)."""
    floor = gradient_floor_bytes(n, h, v, torch.bfloat16, MODES[mode])
    peak = predict_peak_bytes(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=MODES[mode],
                              compute_dtype=torch.bfloat16, memory_budget="min", sm_count=132, tiled=True).step
    assert peak <= 1.05 * floor - ALLOCATOR_SLACK_BYTES


@pytest.mark.parametrize("n,h,v", ANCHOR_ROWS)
@pytest.mark.parametrize("mode", ["amp", "bf16"])
def test_fast_holds_less_than_torch_compile(n, h, v, mode):
    """torch.compile keeps the N×V bf16 logits for its backward (measured on an H200: 1.957 GiB
    over the floor at 8192×4096×128256 in both modes = N·V·2): "fast" must stay strictly below,
    so that where it is slower it is still not dominated."""
    weight_dtype = MODES[mode]
    floor = gradient_floor_bytes(n, h, v, torch.bfloat16, weight_dtype)
    assert _peak(n, h, v, weight_dtype, "fast") < floor + n * v * 2


@pytest.mark.parametrize("mode", ["amp", "bf16"])
def test_min_never_holds_more_than_the_default_and_keeps_the_time_cap_or_the_default_plan(mode):
    """Over ragged and aligned shapes: "min"'s predicted peak ≤ the default's, and either its
    modelled time is within the cap (a split backward's cap where "min" splits) or its budget grew
    all the way to the default's."""
    weight_dtype = MODES[mode]
    for n in (1, 100, 4097, 8192, 32768):
        for h in (64, 768, 4096):
            for v in (1000, 32777, 128256):
                small, default = _plan(n, h, v, weight_dtype, "min"), _plan(n, h, v, weight_dtype, None)
                assert _peak(n, h, v, weight_dtype, "min") <= _peak(n, h, v, weight_dtype, None), (n, h, v)
                factor = SPLIT_TIME_FACTOR if small.hidden_rows else MIN_PLANNED_TIME_FACTOR  # a split: 10/8 FLOPs
                within = _seconds(n, h, v, weight_dtype, small) <= factor * _seconds(n, h, v, weight_dtype, default)
                assert within or small == default, (n, h, v, small, default)


def _balanced(total, align, least, most_chunks):
    return sorted({max(least, -(-(-(-total // k)) // align) * align) for k in range(1, most_chunks + 1)})


def test_min_at_the_users_head_takes_the_block_shape_with_the_fewest_bytes_within_its_time():
    """At 8192×768×32777 in amp the step is host-bound: its time is about its block count.
    Among every balanced split (⌈N/i⌉ rows, ⌈V/j⌉ columns) that models within the cap, "min"
    holds the least: 16 blocks of 2048 × 8320 at 1.77 × the floor, where the default's shape
    widened to 17 blocks of 8192 × 2048 held 1.84 × (in amp a row chunk costs no gradient sum)."""
    n, h, v = 8192, 768, 32777
    weight_dtype = torch.float32
    floor = gradient_floor_bytes(n, h, v, torch.bfloat16, weight_dtype)
    limit = MIN_PLANNED_TIME_FACTOR * _seconds(n, h, v, weight_dtype, _plan(n, h, v, weight_dtype, None))
    chosen = _peak(n, h, v, weight_dtype, "min")
    least = min(
        predict_peak_bytes(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=weight_dtype,
                           compute_dtype=torch.bfloat16, chunk_size=rows, vocab_chunk_size=cols, sm_count=132).step
        for rows in [r for r in _balanced(n, 64, 1, 8) if r >= 1024]
        for cols in [min(v, c) for c in _balanced(v, 128, 1024, 32)]
        if _seconds(n, h, v, weight_dtype, ChunkPlan(rows=rows, cols=cols)) <= limit)
    assert chosen == least
    assert chosen <= 1.78 * floor
    assert _plan(n, h, v, weight_dtype, "min").rows < n



@pytest.mark.parametrize("n,h,v,hidden_dtype", [(8192, 3072, 32064, torch.bfloat16), (8192, 3072, 32064, torch.float32),
                                                 (16384, 3584, 152064, torch.bfloat16),
                                                 (32768, 4096, 128256, torch.bfloat16), (65536, 4096, 128256, torch.bfloat16)])
def test_row_chunks_under_autocast_are_balanced_not_a_thin_remainder(n, h, v, hidden_dtype):
    """Where the default budget cannot hold all N rows' fp32 grad_hidden sum (an fp32 weight), the rows
    come in equal chunks (up to the alignment of 64 rows), not the largest that fit and a thin remainder
    that walks the vocabulary again: at 8192×3072×32064 the largest rows (7854) left a chunk of 338 and
    52 blocks; two chunks of 4096 take 16 (11.9 against 17.0 ms on an H100,
    ``benchmarks/results/balanced-rows-h100-2026-12-05/``). The step's temporaries stay within the
    default budget (plus the model's allowance for small tensors)."""
    plan = plan_chunks(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=torch.float32, compute_dtype=torch.bfloat16,
                       scalar_loss=True, needs_grad=True, cuda=True, sm_count=132)
    chunks = [r1 - r0 for r0, r1 in plan.row_chunks(n)]
    assert len(chunks) > 1 and max(chunks) - min(chunks) < 64 * len(chunks), chunks
    floor = gradient_floor_bytes(n, h, v, hidden_dtype, torch.float32)
    predicted = predict_peak_bytes(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=torch.float32,
                                   compute_dtype=torch.bfloat16, sm_count=132)
    assert predicted.step - floor <= default_budget_bytes(floor, n) + (32 << 20)
