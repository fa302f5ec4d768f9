"""A memory budget in numbers that no plan meets gives one warning naming the predicted peak
(fusedce/budget_warning.py); the named budgets, met budgets and chosen block sizes give none."""
from __future__ import annotations

import warnings

import pytest
import torch

import fusedce
from fusedce.budget_warning import MemoryBudgetWarning

BF16, F32 = torch.bfloat16, torch.float32
N, H, V = 2100, 16, 1500  # a 1024-column block is many times this floor: small budgets cannot be met


@pytest.fixture(autouse=True)
def _fresh_process_state():
    """Each test as a fresh process sees it: no call warned about yet."""
    from fusedce import budget_warning

    budget_warning._warn_once.cache_clear()


def _inputs(dtype=BF16, weight_dtype=None):
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(N, H, generator=generator).to(dtype).requires_grad_()
    weight = torch.randn(V, H, generator=generator).to(weight_dtype or dtype).requires_grad_()
    target = torch.randint(0, V, (N,), generator=generator)
    return hidden, weight, target


def _warnings_of(calls: int = 1, **options) -> list[warnings.WarningMessage]:
    hidden, weight, target = _inputs(weight_dtype=options.pop("weight_dtype", None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the loss itself warns once per process and call
        for _ in range(calls):
            fusedce.linear_cross_entropy(hidden, weight, target, impl="torch", **options).backward()
    return [w for w in caught if issubclass(w.category, MemoryBudgetWarning)]


@pytest.mark.parametrize("budget", [1.05, 100_000])
def test_an_unmet_budget_warns_once_naming_it_and_the_predicted_peak(budget):
    caught = _warnings_of(calls=3, memory_budget=budget)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert f"memory_budget={budget!r} cannot be met at N×H×V = {N}×{H}×{V}" in text
    assert "× the gradient floor" in text and "vocab_chunk_size" in text
    assert caught[0].filename == __file__  # points at the caller's line


def test_the_warned_peak_is_the_memory_models_for_the_plan_that_runs():
    from fusedce.memory_model import predict_peak_bytes

    caught = _warnings_of(memory_budget=1.05)
    predicted = predict_peak_bytes(N, H, V, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16,
                                   memory_budget=1.05, impl="torch")
    floor = 2 * (N * H + V * H)
    assert f"peak at {predicted.step / floor:.3g} × the gradient floor" in str(caught[0].message)


@pytest.mark.parametrize("options", [dict(), dict(memory_budget="min"), dict(memory_budget="fast"),
                                     dict(memory_budget="default"), dict(memory_budget=1000.0),
                                     dict(memory_budget=1 << 30), dict(memory_budget=1.05, vocab_chunk_size=64),
                                     dict(memory_budget=1.05, chunk_size=256, weight_dtype=F32)],
                         ids=["none", "min", "fast", "default", "met-float", "met-bytes", "blocks-chosen",
                              "rows-chosen"])
def test_named_met_or_chosen_budgets_do_not_warn(options):
    assert _warnings_of(**options) == []


def test_a_call_without_gradients_does_not_warn():
    hidden, weight, target = _inputs()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        fusedce.linear_cross_entropy(hidden, weight, target, impl="torch", memory_budget=1.05)
    assert not [w for w in caught if issubclass(w.category, MemoryBudgetWarning)]


def test_bytes_and_a_multiple_of_the_same_value_are_two_budgets():
    """``memory_budget=2`` (2 bytes) after ``2.0`` (twice the floor) at the same shapes: taken for the same
    call, its warning never given."""
    assert len(_warnings_of(memory_budget=2.0)) == 1  # a 1024-column block is ~150 × this floor
    assert len(_warnings_of(memory_budget=2)) == 1


@pytest.mark.parametrize("budget", [1e308, 10 ** 309, 10 ** 400], ids=["1e308", "10**309", "10**400"])
def test_a_vast_budget_is_no_limit(budget):
    """``memory_budget=1e308`` (a multiple of the floor) passed the check, then overflowed converting to
    bytes; ``10**309`` bytes passed it too, then overflowed in the warning's check (bytes + a float)."""
    from fusedce.planner import plan_chunks

    plan = plan_chunks(N, H, V, hidden_dtype=BF16, weight_dtype=BF16, compute_dtype=BF16, memory_budget=budget)
    assert plan.cols == V and _warnings_of(memory_budget=budget) == []


def test_the_warning_is_the_packages_own_name():
    assert fusedce.MemoryBudgetWarning is MemoryBudgetWarning and "MemoryBudgetWarning" in fusedce.__all__
