"""Grid expansion and validation."""
from __future__ import annotations

import pytest

from fusedce_profiler.grid.spec import GridSpec


def test_grid_expands_to_the_product_in_a_stable_order():
    grid = GridSpec(tokens=(64, 16), vocab=(100,), hidden=(8, 4), backends=("torch", "fusedce"),
                    modes=("amp-bf16", "fp32"), device="cpu", bias=(False, True))
    cells = grid.cells()
    assert len(cells) == 2 * 1 * 2 * 2 * 2 * 2
    assert len({c.key() for c in cells}) == len(cells)
    assert [c.backend for c in cells[:2]] == ["torch", "fusedce"]  # back-ends side by side
    assert [c.hidden for c in cells] == sorted((c.hidden for c in cells), key=[8, 4].index)
    torch_fp32 = [c.tokens for c in cells if c.hidden == 8 and c.mode == "fp32" and not c.bias and c.backend == "torch"]
    assert torch_fp32 == [64, 16]  # in the order given


def test_batch_and_seq_give_tokens_and_are_kept():
    cells = GridSpec(batch=(2, 4), seq=(8,), tokens=(), backends=("torch",), device="cpu").cells()
    assert [(c.tokens, c.batch, c.seq) for c in cells] == [(16, 2, 8), (32, 4, 8)]


def test_cells_carry_every_option():
    cells = GridSpec(tokens=(8,), vocab=(16,), hidden=(4,), backends=("torch",), device="cpu",
                     ignore_frac=(0.3,), label_smoothing=(0.1,), z_loss=(1e-4,), softcap=(30.0,),
                     reduction="sum", seed=7).cells()
    (cell,) = cells
    assert (cell.ignore_frac, cell.label_smoothing, cell.z_loss, cell.softcap, cell.reduction, cell.seed) == (
        0.3, 0.1, 1e-4, 30.0, "sum", 7)


@pytest.mark.parametrize("change, fragment", [
    ({"tokens": (0,)}, "tokens"),
    ({"tokens": (1.5,)}, "tokens"),
    ({"vocab": ()}, "vocab"),
    ({"hidden": (-4,)}, "hidden"),
    ({"backends": ("nope",)}, "nope"),
    ({"modes": ("fp8",)}, "modes"),
    ({"device": "tpu"}, "device"),
    ({"device": "cpu:1"}, "device"),
    ({"ignore_frac": (1.0,)}, "ignore_frac"),
    ({"label_smoothing": (-0.1,)}, "label_smoothing"),
    ({"z_loss": (-1.0,)}, "z_loss"),
    ({"softcap": (0.0,)}, "softcap"),
    ({"reduction": "avg"}, "reduction"),
    ({"repeats": 0}, "repeats"),
    ({"batch": (2,)}, "batch and seq"),
])
def test_bad_grid_values_are_value_errors_naming_the_field(change, fragment):
    base = dict(tokens=(8,), vocab=(16,), hidden=(4,), backends=("torch",), device="cpu")
    with pytest.raises(ValueError, match=fragment):
        GridSpec(**{**base, **change}).cells()


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        GridSpec(tokens=(8,), vocab=(16,), hidden=(4,), backends=("torch",), device="cuda").validate()
