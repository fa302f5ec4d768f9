"""The benchmark's fixed quantities: rows, floors, FLOPs, inputs (benchmarks/protocol.py)."""
import pytest
import torch

from benchmarks.protocol import (ANCHOR_ROWS, GIB, IGNORE_INDEX, MIB, Row, floor_bytes, make_inputs,
                                 memory_goal_bytes, parse_row, step_flops, tflops)

LLAMA_HEAD = Row(8192, 4096, 128256)


@pytest.mark.parametrize(
    "row, mode, peak_gib, times_floor",
    [  # (peak extra GiB, × floor) pairs copied from shared/ANCHORS.md
        (Row(8192, 768, 32777), "amp-bf16", 2.548, 24.15),
        (Row(8192, 768, 32777), "bf16", 1.500, 25.60),
        (Row(8192, 2304, 256000), "amp-bf16", 20.630, 9.24),
        (Row(8192, 4096, 128256), "bf16", 5.871, 5.64),
        (Row(32768, 4096, 128256), "amp-bf16", 40.119, 18.18),
    ],
)
def test_floor_bytes_reproduces_the_anchor_tables_times_floor_column(row, mode, peak_gib, times_floor):
    ratio = peak_gib * GIB / floor_bytes(row, mode)
    assert ratio == pytest.approx(times_floor, rel=5e-3)


def test_floor_bytes_counts_grad_hidden_bf16_and_grad_weight_in_the_weight_dtype():
    row = Row(10, 3, 7)
    assert floor_bytes(row, "amp-bf16") == 10 * 3 * 2 + 7 * 3 * 4
    assert floor_bytes(row, "bf16") == 10 * 3 * 2 + 7 * 3 * 2
    assert floor_bytes(row, "amp-bf16", bias=True) == 10 * 3 * 2 + 7 * 3 * 4 + 7 * 4


def test_floor_bytes_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        floor_bytes(Row(1, 1, 1), "fp8")


def test_memory_goal_is_ten_percent_over_the_floor_plus_128_mib():
    assert memory_goal_bytes(GIB) == pytest.approx(1.1 * GIB + 128 * MIB)


def test_step_flops_and_tflops_reproduce_an_anchor_rate():
    # ANCHORS.md: 8192×4096×128256 bf16 torch, 40.8 ms -> 633 TFLOP/s
    assert step_flops(LLAMA_HEAD) == 6 * 8192 * 4096 * 128256
    assert tflops(step_flops(LLAMA_HEAD), 40.8) == pytest.approx(633, abs=0.5)


@pytest.mark.parametrize("text", ["8192x768x32777", "8192×768×32777", " 8192 x 768 x 32777 "])
def test_parse_row_accepts_both_separators_and_keeps_the_anchor_label(text):
    row = parse_row(text)
    assert (row.tokens, row.hidden, row.vocab) == (8192, 768, 32777)
    assert row.label == ANCHOR_ROWS[0].label != ""


@pytest.mark.parametrize("text", ["8192x768", "axbxc", "8192x768x32777x2", ""])
def test_parse_row_rejects_text_that_is_not_three_sizes(text):
    with pytest.raises(ValueError, match="NxHxV"):
        parse_row(text)


def test_row_rejects_a_zero_size_naming_the_field():
    with pytest.raises(ValueError, match="hidden"):
        parse_row("16x0x8")


def test_make_inputs_gives_the_protocol_dtypes_and_grad_flags():
    amp = make_inputs(Row(12, 8, 20), "amp-bf16", device="cpu", bias=True)
    bf16 = make_inputs(Row(12, 8, 20), "bf16", device="cpu", bias=True)
    assert amp.hidden.dtype == bf16.hidden.dtype == torch.bfloat16
    assert amp.weight.dtype == amp.bias.dtype == torch.float32
    assert bf16.weight.dtype == bf16.bias.dtype == torch.bfloat16
    assert all(t.requires_grad for t in amp.leaves() + bf16.leaves())
    assert not amp.target.requires_grad and amp.target.shape == (12,)
    # same draw in both modes: bf16 is the rounded amp weight
    assert torch.equal(bf16.weight, amp.weight.to(torch.bfloat16))
    assert torch.equal(bf16.hidden, amp.hidden)


def test_make_inputs_ignores_exactly_the_requested_fraction_and_is_deterministic():
    first = make_inputs(Row(40, 4, 9), "bf16", device="cpu", ignore_frac=0.3, seed=3)
    second = make_inputs(Row(40, 4, 9), "bf16", device="cpu", ignore_frac=0.3, seed=3)
    assert int((first.target == IGNORE_INDEX).sum()) == 12
    assert torch.equal(first.target, second.target) and torch.equal(first.weight, second.weight)
    valid = first.target[first.target != IGNORE_INDEX]
    assert valid.min() >= 0 and valid.max() < 9


def test_make_inputs_rejects_an_ignore_fraction_outside_zero_one():
    with pytest.raises(ValueError, match="ignore_frac"):
        make_inputs(Row(4, 4, 4), "bf16", device="cpu", ignore_frac=1.5)


def test_clear_grads_drops_every_gradient():
    inputs = make_inputs(Row(4, 4, 4), "bf16", device="cpu", bias=True)
    for leaf in inputs.leaves():
        leaf.grad = torch.ones_like(leaf)
    inputs.clear_grads()
    assert all(leaf.grad is None for leaf in inputs.leaves())
