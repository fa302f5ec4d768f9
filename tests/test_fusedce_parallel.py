"""The vocabulary-parallel loss on the CPU: gloo process groups of 2 and 3 processes.

Every rank builds the same inputs from the case's seed, holds its ``torch.chunk`` shard of
the weight (V = 37 over 3 processes: 13 + 13 + 11 rows) and checks, for every option and
reduction, the loss and every gradient against the single-process fusedce result on the
whole weight and against the float64 reference: fp64 runs to 1e-12 of one process (only the
order of the sums differs) and 1e-10 of the reference; fp32 runs to 1e-6 of one process and
1e-5 of the reference; amp-bf16 to 1e-2 in norm. Each world runs all its cases in one
``torch.multiprocessing.spawn`` (start-up is most of the time). A rank's failed assertion fails
the test with its traceback; :func:`distributed.run_world` stops the other ranks.
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

import fusedce
from distributed import run_world
from reference import (
    OPTION_CASES,
    REDUCTIONS,
    LossAndGrads,
    LossOptions,
    assert_matches_reference,
    make_inputs,
    make_upstream,
    reference_linear_cross_entropy,
    relative_error,
    run_fused,
    seed_for,
)

N, H, V = 24, 8, 37
TOLERANCES = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-6, 1e-5)}  # (vs one process, vs reference)


def _inputs(case_name: str, reduction: str, dtype: torch.dtype, v: int = V, n: int = N):
    case = OPTION_CASES[case_name]
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    seed = seed_for("parallel", case_name, reduction, v)
    hidden, weight, target, bias = make_inputs(n, H, v, seed=seed, with_bias=case.with_bias,
                                               ignore_fraction=case.ignore_fraction,
                                               ignore_index=options.ignore_index, dtype=dtype)
    return options, hidden, weight, target, bias, make_upstream(target, reduction, seed + 1)


def _shard(t: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if t is None else t.detach()[start:stop].clone().requires_grad_(t.requires_grad)


def _rows(result: LossAndGrads, start: int, stop: int) -> LossAndGrads:
    """``result`` with grad_weight / grad_bias cut to the shard's rows."""
    return LossAndGrads(loss=result.loss, grad_hidden=result.grad_hidden,
                        grad_weight=None if result.grad_weight is None else result.grad_weight[start:stop],
                        grad_bias=None if result.grad_bias is None else result.grad_bias[start:stop])


def _assert_near(got: LossAndGrads, want: LossAndGrads, rtol: float, what: str) -> None:
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), f"{what}: {field} present in one result only"
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {field} {a.dtype}{tuple(a.shape)}"
            err = relative_error(a, b)
            assert err <= rtol, f"{what}: {field} relative error {err:.3g} > {rtol:g} against one process"


def _check_case(rank: int, world: int, case_name: str, reduction: str, dtype: torch.dtype, v: int = V,
                vocab_start: int | None = None, stop: int | None = None, **kwargs) -> LossAndGrads:
    """One case on this rank: the parallel result against one process and the reference."""
    options, hidden, weight, target, bias, upstream = _inputs(case_name, reduction, dtype, v)
    if vocab_start is None:
        start, stop = fusedce.vocab_shard_bounds(v, world, rank)
    else:
        start = vocab_start
    one = run_fused(functools.partial(fusedce.linear_cross_entropy, impl="torch"), hidden, weight, target, bias,
                    upstream, **options.as_kwargs())
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    parallel = functools.partial(fusedce.vocab_parallel_linear_cross_entropy, vocab_size=v,
                                 vocab_start=vocab_start, **kwargs)
    got = run_fused(parallel, hidden.detach().clone().requires_grad_(), _shard(weight, start, stop), target,
                    _shard(bias, start, stop), upstream, **options.as_kwargs())
    one_rtol, ref_rtol = TOLERANCES[dtype]
    what = f"rank {rank}/{world} {case_name} {reduction} {dtype}"
    _assert_near(got, _rows(one, start, stop), one_rtol, what)
    assert_matches_reference(got, _rows(want, start, stop), rtol=ref_rtol)
    return got


def _gathered(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())
    return out


# --- world size 3: every option and reduction, uneven shards, edge cases, DTensor -------------


def _world_of_three(rank: int, world: int) -> None:
    for case_name in OPTION_CASES:
        for reduction in REDUCTIONS:
            # fp64: row and vocabulary chunks (3 row chunks of a ragged shard: several collectives)
            _check_case(rank, world, case_name, reduction, torch.float64, chunk_size=10, vocab_chunk_size=4)
            _check_case(rank, world, case_name, reduction, torch.float32)  # the default plan
    _empty_shard(rank, world)
    _explicit_split(rank, world)
    _out_of_range_targets(rank, world)
    _deterministic_and_the_same_on_every_rank(rank, world)
    _amp_bf16(rank, world)
    _dtensor_weight_in_dtensor_grad_out(rank, world)


def _empty_shard(rank: int, world: int) -> None:
    """V = 2 over 3 processes: torch.chunk gives rank 2 no rows; it still joins every collective."""
    assert fusedce.vocab_shard_bounds(2, world, rank)[1] - fusedce.vocab_shard_bounds(2, world, rank)[0] == (
        0 if rank == 2 else 1)
    for case_name in ("plain", "mixed"):
        for reduction in REDUCTIONS:
            got = _check_case(rank, world, case_name, reduction, torch.float64, v=2, chunk_size=10)
            if rank == 2:
                assert got.grad_weight.shape == (0, H)


def _explicit_split(rank: int, world: int) -> None:
    """Any split with vocab_start: rows [0, 20), [20, 30), [30, 37)."""
    start, stop = [(0, 20), (20, 30), (30, 37)][rank]
    for reduction in REDUCTIONS:
        _check_case(rank, world, "mixed", reduction, torch.float64, vocab_start=start, stop=stop, vocab_chunk_size=6)


def _out_of_range_targets(rank: int, world: int) -> None:
    """As in one process: IndexError on the CPU by default (every rank raises, no collective
    is left waiting); without validation a NaN loss for that token and NaN gradients."""
    options, hidden, weight, target, bias, _ = _inputs("plain", "none", torch.float64)
    start, stop = fusedce.vocab_shard_bounds(V, world, rank)
    target = target.clone()
    target[3] = V  # the first id past the last shard
    w = _shard(weight, start, stop)
    with pytest.raises(IndexError, match=r"\[0, 37\)"):
        fusedce.vocab_parallel_linear_cross_entropy(hidden, w, target, vocab_size=V, reduction="none")
    got = fusedce.vocab_parallel_linear_cross_entropy(hidden, w, target, vocab_size=V, reduction="none",
                                                      validate_targets=False)
    one = fusedce.linear_cross_entropy(hidden, weight, target, reduction="none", impl="torch", validate_targets=False)
    assert torch.isnan(got[3]) and torch.isnan(one[3])
    keep = torch.arange(N) != 3
    torch.testing.assert_close(got[keep], one[keep], rtol=1e-12, atol=0)
    got.sum().backward()
    assert torch.isnan(w.grad).all()  # every row of grad_W sums the NaN token's row, as in one process


def _deterministic_and_the_same_on_every_rank(rank: int, world: int) -> None:
    options, hidden, weight, target, bias, upstream = _inputs("mixed", "mean", torch.float32)
    start, stop = fusedce.vocab_shard_bounds(V, world, rank)
    runs = []
    for _ in range(2):
        runs.append(run_fused(functools.partial(fusedce.vocab_parallel_linear_cross_entropy, vocab_size=V,
                                                chunk_size=10, vocab_chunk_size=4),
                              hidden.detach().clone().requires_grad_(), _shard(weight, start, stop), target,
                              _shard(bias, start, stop), upstream, **options.as_kwargs()))
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        assert torch.equal(getattr(runs[0], field), getattr(runs[1], field)), f"{field} differs between runs"
    for field in ("loss", "grad_hidden"):
        copies = _gathered(getattr(runs[0], field), world)
        assert all(torch.equal(c, copies[0]) for c in copies), f"{field} differs between ranks"


def _amp_bf16(rank: int, world: int) -> None:
    """bf16 autocast, fp32 master weight and bias, bf16 hidden: each gradient in its input's dtype."""
    options, hidden, weight, target, bias, upstream = _inputs("mixed", "mean", torch.float32)
    hidden = hidden.detach().to(torch.bfloat16).requires_grad_()
    start, stop = fusedce.vocab_shard_bounds(V, world, rank)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        one = run_fused(functools.partial(fusedce.linear_cross_entropy, impl="torch"), hidden, weight, target, bias,
                        upstream, **options.as_kwargs())
        got = run_fused(functools.partial(fusedce.vocab_parallel_linear_cross_entropy, vocab_size=V),
                        hidden.detach().clone().requires_grad_(), _shard(weight, start, stop), target,
                        _shard(bias, start, stop), upstream, **options.as_kwargs())
    assert got.grad_hidden.dtype == torch.bfloat16 and got.grad_weight.dtype == got.grad_bias.dtype == torch.float32
    _assert_near(got, _rows(one, start, stop), 1e-2, f"rank {rank} amp-bf16")
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    assert_matches_reference(got, _rows(want, start, stop), rtol=1e-2, norm_only=True)


def _dtensor_weight_in_dtensor_grad_out(rank: int, world: int) -> None:
    """A Shard(0) DTensor weight and bias (V = 37: uneven), Replicate() hidden states: the loss
    is a plain tensor, the gradients DTensors placed like their parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    options, hidden, weight, target, bias, upstream = _inputs("mixed", "sum", torch.float64)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    w = distribute_tensor(weight.detach(), mesh, [Shard(0)]).requires_grad_()
    b = distribute_tensor(bias.detach(), mesh, [Shard(0)]).requires_grad_()
    h = distribute_tensor(hidden.detach(), mesh, [Replicate()]).requires_grad_()
    loss = fusedce.vocab_parallel_linear_cross_entropy(h, w, target, b, **options.as_kwargs())
    assert type(loss) is torch.Tensor
    (loss * upstream).backward()
    for grad, param, expected in ((w.grad, w, want.grad_weight), (b.grad, b, want.grad_bias),
                                  (h.grad, h, want.grad_hidden)):
        assert isinstance(grad, DTensor) and grad.placements == param.placements and grad.shape == param.shape
        torch.testing.assert_close(grad.full_tensor(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, want.loss, rtol=1e-10, atol=0)
    with pytest.raises(TypeError, match="vocab_parallel_linear_cross_entropy"):
        fusedce.linear_cross_entropy(hidden, w, target)
    with pytest.raises(ValueError, match="Replicate"):
        fusedce.vocab_parallel_linear_cross_entropy(distribute_tensor(hidden.detach(), mesh, [Shard(0)]), w, target)
    with pytest.raises(ValueError, match="vocab_size=36"):
        fusedce.vocab_parallel_linear_cross_entropy(hidden, w, target, vocab_size=36)


def test_vocab_parallel_loss_equals_one_process_on_three_ranks_with_an_uneven_split():
    run_world(_world_of_three, 3, timeout_s=150)


# --- world size 2: the options again on an even-odd split, the Triton path, torch.compile ------


def _world_of_two(rank: int, world: int) -> None:
    for case_name in ("plain", "mixed", "label_smoothing", "ignore_index_is_a_class"):
        for reduction in REDUCTIONS:
            _check_case(rank, world, case_name, reduction, torch.float64, vocab_chunk_size=8)
    for reduction in REDUCTIONS:  # the Triton kernels (interpreted on the CPU) with the vocabulary offset
        _check_case(rank, world, "mixed", reduction, torch.float32, impl="triton", vocab_chunk_size=16)
    _compiled(rank, world)


def _compiled(rank: int, world: int) -> None:
    """Under torch.compile the loss is a graph break: compiled and eager give the same values."""
    options, hidden, weight, target, bias, upstream = _inputs("mixed", "mean", torch.float64)
    start, stop = fusedce.vocab_shard_bounds(V, world, rank)
    w = _shard(weight, start, stop)

    def step(h, w_shard, t):
        return fusedce.vocab_parallel_linear_cross_entropy(torch.tanh(h), w_shard, t, vocab_size=V) * 2.0

    eager = run_fused(lambda h, w_, t, b: step(h, w_, t), hidden, w, target)
    compiled = run_fused(lambda h, w_, t, b: torch.compile(step, backend="eager")(h, w_, t), hidden, w, target)
    _assert_near(compiled, eager, 1e-15, f"rank {rank} compiled")


def test_vocab_parallel_loss_equals_one_process_on_two_ranks():
    run_world(_world_of_two, 2, timeout_s=120)


# --- one process: the split, and what is refused -----------------------------------------------


@pytest.mark.parametrize("v,world", [(37, 3), (2, 3), (8, 4), (1, 2), (100, 7)])
def test_shard_bounds_follow_torch_chunk(v, world):
    sizes = [c.shape[0] for c in torch.arange(v).chunk(world)] + [0] * world
    bounds = [fusedce.vocab_shard_bounds(v, world, r) for r in range(world)]
    assert [stop - start for start, stop in bounds] == sizes[:world]
    assert bounds[0][0] == 0 and all(bounds[r][1] == bounds[r + 1][0] for r in range(world - 1))
    assert bounds[-1][1] == v


def test_vocab_parallel_loss_needs_a_process_group():
    hidden, weight, target, _ = make_inputs(4, 8, 5, seed=1)
    with pytest.raises(RuntimeError, match="init_process_group"):
        fusedce.vocab_parallel_linear_cross_entropy(hidden, weight, target, vocab_size=5)
