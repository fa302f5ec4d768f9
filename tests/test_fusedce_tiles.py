"""The tiled kernels (product and softmax math in one kernel) against the float64 reference.

On a machine without CUDA they run in Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``) on fp16 CPU tensors — the interpreter cannot multiply bf16 — with
``tiles_supported`` widened to the CPU; the GPU tests run them compiled on CUDA. Each test
counts the tiled launches, so a path that silently fell back to the block kernels fails.
"""
import importlib.util
import os

import pytest
import torch

import fusedce
from reference import (
    OPTION_CASES,
    LossOptions,
    assert_matches_reference,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    run_fused,
    seed_for,
)

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the Triton kernels cannot run", allow_module_level=True)

from fusedce import kernels  # noqa: E402  (imports triton)

if not hasattr(kernels, "tile_stats"):
    pytest.skip("this Triton has no host-side tensor descriptors", allow_module_level=True)

from fusedce.kernels import tiles  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float16
RTOL = 1e-2  # 2-byte inputs and gradients (the block path's tolerance at the same dtype)


@pytest.fixture
def launches(monkeypatch):
    """Counts of the tiled launches; on the CPU, the tiled kernels allowed for aligned operands."""
    counts = {"stats": 0, "grad": 0}
    stats, grad = kernels.tile_stats, kernels.tile_grad

    def counted_stats(h, w, *args, **kwargs):
        counts["stats"] += 1
        return stats(h, w, *args, **kwargs)

    def counted_grad(*args, **kwargs):
        counts["grad"] += 1
        return grad(*args, **kwargs)

    monkeypatch.setattr(kernels, "tile_stats", counted_stats)
    monkeypatch.setattr(kernels, "tile_grad", counted_grad)
    if not CUDA:
        monkeypatch.setattr(kernels, "tiles_supported", tiles._operands_fit)
        monkeypatch.setattr(kernels, "tiles_planned", lambda h, w, dtype, device=None: tiles._layout_planned(h, w, dtype))
    return counts


def _check(n, h, v, case_name, reduction, **kwargs):
    case = OPTION_CASES[case_name]
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    seed = seed_for("tiles", n, h, v, case_name, reduction, tuple(kwargs.items()))
    hidden, weight, target, bias = make_inputs(n, h, v, seed=seed, with_bias=case.with_bias,
                                               ignore_fraction=case.ignore_fraction,
                                               ignore_index=options.ignore_index, dtype=DTYPE, device=DEVICE)
    upstream = make_upstream(target, reduction, seed + 1)
    got = run_fused(lambda *a, **k: fusedce.linear_cross_entropy(*a, impl="triton", **k),
                    hidden, weight, target, bias, upstream, **options.as_kwargs(), **kwargs)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    assert_matches_reference(got, want, rtol=RTOL)


@pytest.mark.parametrize("case_name", ["plain", "ignored_targets", "label_smoothing", "z_loss", "softcap", "bias",
                                       "mixed"])
def test_every_option_through_the_tiles_matches_the_reference(case_name, launches):
    """Bias, soft-cap, label smoothing, z-loss and ignored targets, in the tile epilogues."""
    _check(37, 40, 131, case_name, "mean")
    assert launches["stats"] >= 1 and launches["grad"] >= 1


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_many_row_and_vocabulary_chunks_go_through_the_tiles(reduction, launches):
    """Ragged row chunks (7 of 37 tokens) and vocabulary chunks (48 of 131): every block tiled."""
    _check(37, 24, 131, "mixed", reduction, chunk_size=7, vocab_chunk_size=48)
    assert launches["grad"] == 6 * 3  # 6 row chunks × 3 vocabulary chunks
    assert launches["stats"] == 6  # forward: the whole vocabulary in one launch per row chunk


def test_a_row_wider_than_one_tile_and_more_rows_than_one_tile(launches):
    """V = 600 (three 256-column tiles, the last partial) and N = 150 (two 128-row tiles)."""
    _check(150, 16, 600, "mixed", "mean")
    assert launches["stats"] >= 1


def test_forward_falls_back_to_a_launch_per_block_when_the_partials_do_not_fit(launches, monkeypatch):
    monkeypatch.setattr(kernels, "partial_bytes", lambda rows, cols: 1 << 60)
    _check(37, 24, 131, "mixed", "mean", vocab_chunk_size=48)
    assert launches["stats"] == 3


def test_unaligned_operands_take_the_block_kernels(launches):
    """H = 33: rows that are not 16-byte aligned cannot be read through a tensor descriptor."""
    _check(37, 33, 131, "mixed", "mean")
    assert launches == {"stats": 0, "grad": 0}


def test_tiled_results_are_bitwise_reproducible(launches):
    hidden, weight, target, bias = make_inputs(150, 16, 600, seed=7, with_bias=True, dtype=DTYPE, device=DEVICE)
    results = [run_fused(lambda *a, **k: fusedce.linear_cross_entropy(*a, impl="triton", softcap=4.0, **k),
                         hidden, weight, target, bias) for _ in range(2)]
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(results[0], field), getattr(results[1], field)), field


def test_tiles_supported_needs_aligned_two_byte_operands_of_one_dtype():
    h = torch.zeros(4, 16, dtype=torch.float16)
    assert tiles._operands_fit(h, torch.zeros(8, 16, dtype=torch.float16))
    assert not tiles._operands_fit(h, torch.zeros(8, 16, dtype=torch.bfloat16))
    assert not tiles._operands_fit(h.float(), torch.zeros(8, 16))
    assert not tiles._operands_fit(torch.zeros(4, 12, dtype=torch.float16), torch.zeros(8, 12, dtype=torch.float16))
    assert not tiles._operands_fit(h[:, 1:9], torch.zeros(8, 8, dtype=torch.float16))
    if not CUDA:
        assert not tiles.tiles_supported(h, torch.zeros(8, 16, dtype=torch.float16))  # CPU: never in a real run


def test_a_tile_kernel_this_gpu_cannot_compile_falls_back_to_the_block_kernels(launches, monkeypatch):
    """Out of shared memory while compiling: nothing was written, the block kernels take over,
    and the variant is not tried again."""
    import triton

    attempts = []

    class Unbuildable:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                attempts.append(kwargs["GRAD"])
                raise triton.runtime.errors.OutOfResources(278552, 232448, "shared memory")
            return launch

    monkeypatch.setattr(tiles, "logit_tiles_kernel", Unbuildable())
    monkeypatch.setattr(tiles, "_UNAVAILABLE", set())
    _check(37, 40, 131, "mixed", "mean", vocab_chunk_size=48)
    assert sorted(set(attempts)) == [False, True] and len(attempts) == 2  # one try per variant


def test_a_tiled_plan_holds_half_an_fp32_block_and_twice_the_columns():
    """The tiled kernels store a block's 2-byte gradients, never its fp32 logits: the same budget
    holds twice the columns (8192×768×32777 in bf16: 4864 columns, not 2432)."""
    from fusedce.memory_model import predict_peak_bytes
    from fusedce.planner import plan_chunks

    args = dict(hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16, compute_dtype=torch.bfloat16,
                scalar_loss=True, needs_grad=True, cuda=True, sm_count=132)
    blocks, tiled = plan_chunks(8192, 768, 32777, **args), plan_chunks(8192, 768, 32777, **args, tiled=True)
    assert (blocks.cols, tiled.cols, tiled.tiled, blocks.tiled) == (2432, 4864, True, False)
    autocast = {**args, "weight_dtype": torch.float32}  # the fp32 weight converted chunk by chunk: 2432 → 4736
    assert (plan_chunks(8192, 768, 32777, **autocast).cols, plan_chunks(8192, 768, 32777, **autocast, tiled=True).cols
            ) == (2432, 4736)
    assert plan_chunks(8192, 768, 32777, **{**args, "compute_dtype": torch.float32}, tiled=True).tiled is False
    model = dict(hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16, compute_dtype=torch.bfloat16,
                 sm_count=132)
    same_budget = predict_peak_bytes(8192, 768, 32777, **model, tiled=True).step - \
        predict_peak_bytes(8192, 768, 32777, **model, tiled=False).step
    assert abs(same_budget) < (1 << 20)  # twice the columns in the same bytes


@pytest.mark.parametrize("tensors", ["real", "meta", "fake"])
def test_the_tiled_plan_is_judged_without_reading_an_address(tensors):
    """The plan's layout check reads dtypes, shapes and strides only: under ``torch.compile`` the
    operands are fake tensors (no address) and a converted chunk has no buffer yet. A 2-byte
    compute dtype and H a multiple of 8 make a converted operand fit; an operand already in the
    compute dtype must also have the descriptors' strides (its address is checked at the launch:
    ``test_a_block_the_kernels_refuse_in_a_tiled_plan_goes_in_pieces_that_fit``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def check():
        bf16, fp32 = torch.bfloat16, torch.float32
        make = (lambda shape, dtype: torch.empty(shape, dtype=dtype, device="meta")) if tensors == "meta" \
            else (lambda shape, dtype: torch.empty(shape, dtype=dtype))
        wide = make((64, 40), bf16)
        return [tiles._layout_planned(make((64, 32), fp32), make((100, 32), fp32), bf16),  # autocast: converted
                tiles._layout_planned(make((64, 32), bf16), make((100, 32), fp32), bf16),
                tiles._layout_planned(make((64, 32), bf16), make((100, 32), bf16), bf16),
                tiles._layout_planned(make((64, 12), fp32), make((100, 12), fp32), bf16),  # rows of 24 bytes
                tiles._layout_planned(make((64, 32), fp32), make((100, 32), fp32), fp32),  # 4-byte compute
                tiles._layout_planned(wide[:, 8:40], make((100, 32), bf16), bf16),  # 16 bytes in, row stride 40
                tiles._layout_planned(wide[:, 4:36], make((100, 32), bf16), bf16),  # 8 bytes in: refused at launch
                tiles._layout_planned(make((32, 64), bf16).t(), make((100, 32), bf16), bf16)]  # column-major

    if tensors == "fake":
        with FakeTensorMode():
            got = check()
    else:
        got = check()
    assert got == [True, True, True, False, False, True, True, False]


def test_the_tiled_plans_layout_check_traces_under_a_fullgraph_compile():
    """Dynamo traces the check (``torch.compile(fullgraph=True)`` of a loss decides its plan while
    tracing): reading ``storage_offset()`` or ``data_ptr()`` there fails the whole compile."""
    compiled = torch.compile(lambda h, w: torch.zeros(()) if tiles._layout_planned(h, w, torch.float16) else
                             torch.ones(()), fullgraph=True, backend="eager")
    assert compiled(torch.empty(4, 16), torch.empty(8, 16)).item() == 0.0
    assert compiled(torch.empty(4, 12), torch.empty(8, 12)).item() == 1.0


def test_a_block_the_kernels_refuse_in_a_tiled_plan_goes_in_pieces_that_fit(launches, monkeypatch):
    """A tiled plan's buffer is half an fp32 block; a block the tiled kernels refuse (here: all
    of them) is multiplied in column pieces whose fp32 logits fit it, and the result holds."""
    from fusedce import block_math_torch
    from fusedce.block_workspace import BlockWorkspace

    pieces = []
    logits = BlockWorkspace.logits

    def counted(self, h_i, w_j):
        pieces.append(w_j.shape[0])
        assert h_i.shape[0] * w_j.shape[0] <= self.block.numel()
        return logits(self, h_i, w_j)

    monkeypatch.setattr(BlockWorkspace, "logits", counted)
    monkeypatch.setattr(kernels, "tiles_supported", lambda h, w: False)
    _check(37, 24, 300, "mixed", "mean", vocab_chunk_size=256)
    assert launches == {"stats": 0, "grad": 0}
    assert max(pieces) < 256 and sum(pieces) == 2 * 300  # forward and backward, each column once
    del block_math_torch


def _check_autocast(n, h, v, **kwargs):
    """An fp32 weight (and bias) with 2-byte hidden under autocast: the weight is converted chunk by chunk."""
    seed = seed_for("tiles-autocast", n, h, v, tuple(kwargs.items()))
    hidden, weight, target, bias = make_inputs(n, h, v, seed=seed, with_bias=True, ignore_fraction=0.1,
                                               dtype=DTYPE, device=DEVICE)
    weight = weight.detach().float().requires_grad_()
    bias = bias.detach().float().requires_grad_()
    options = LossOptions(label_smoothing=0.1, z_loss=1e-3, softcap=8.0)

    def fused(*a, **k):
        with torch.autocast(DEVICE, dtype=DTYPE):
            return fusedce.linear_cross_entropy(*a, impl="triton", **k)

    got = run_fused(fused, hidden, weight, target, bias, **options.as_kwargs(), **kwargs)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, None)
    assert_matches_reference(got, want, rtol=RTOL)


def test_an_autocast_forward_converts_the_weight_into_the_block_buffer_in_wide_chunks(launches, monkeypatch):
    """The plan's blocks are 128 columns of 2-byte gradients (37 × 128 × 2 bytes, 64 columns of fp32
    logits); the same bytes hold 256 columns of the weight converted to 2 bytes beside their
    partials: three tiled launches over V = 600 instead of ten pieces, and no chunk wider than the buffer."""
    from fusedce.block_workspace import BlockWorkspace

    widths = []
    chunk_view = BlockWorkspace.weight_chunk_view

    def counted(self, cols, h, dtype):
        w, scratch = chunk_view(self, cols, h, dtype)
        widths.append(cols)
        assert w.untyped_storage().data_ptr() == self.block.untyped_storage().data_ptr()
        assert scratch.data_ptr() >= w.data_ptr() + w.numel() * w.element_size()
        return w, scratch

    monkeypatch.setattr(BlockWorkspace, "weight_chunk_view", counted)
    _check_autocast(37, 16, 600, vocab_chunk_size=128)
    assert widths == [256, 256, 88]  # a tiled plan's buffer: 37 × 128 × 2 bytes
    assert launches == {"stats": 3, "grad": 5}  # the backward's blocks tiled, on converted chunks


def test_an_autocast_forward_takes_chunks_twice_the_block_paths_fp32_columns_in_a_tiled_plan(launches, monkeypatch):
    """A tiled plan's buffer holds half its columns of fp32 logits (the block path's pieces: 96 of the
    plan's 192 here); converted chunks of H = 24 are 256 columns wide — narrower than twice the
    plan's columns, more than twice the pieces' — so they go in wide launches."""
    from fusedce.block_workspace import BlockWorkspace

    widths = []
    chunk_view = BlockWorkspace.weight_chunk_view

    def counted(self, cols, h, dtype):
        widths.append(cols)
        return chunk_view(self, cols, h, dtype)

    monkeypatch.setattr(BlockWorkspace, "weight_chunk_view", counted)
    _check_autocast(37, 24, 600, vocab_chunk_size=192)
    assert widths == [256, 256, 88] and launches["stats"] == 3


@pytest.mark.parametrize("h,v,cols", [(64, 300, 48), (64, 1100, 512)])
def test_an_autocast_forward_keeps_the_blocks_where_the_buffer_holds_no_chunk_twice_as_wide(launches, h, v, cols):
    """H = 64: 256 columns of converted weight (32 KiB) do not fit a 37 × 48 tiled block (3.5 KiB); a
    37 × 512 one (37 KiB) holds 256 columns of weight, no more than the block path's 256-column
    pieces of fp32 logits, so the wide chunks would not halve the forward's launches."""
    _check_autocast(37, h, v, vocab_chunk_size=cols)
    assert launches["stats"] == 0 and launches["grad"] == -(-v // cols)


def test_an_autocast_forward_refused_after_its_first_chunk_finishes_in_blocks(launches, monkeypatch):
    """A chunk the tiled kernels refuse (here the second) and every column after it go through the
    block kernels; the columns already folded are not folded again."""
    stats = kernels.tile_stats
    calls = []

    def second_refused(*args, **kwargs):
        calls.append(1)
        return False if len(calls) == 2 else stats(*args, **kwargs)

    monkeypatch.setattr(kernels, "tile_stats", second_refused)
    _check_autocast(37, 16, 1100, vocab_chunk_size=128)  # chunks of 256 in a tiled plan's buffer: the second refused
    assert len(calls) == 2
