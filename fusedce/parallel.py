"""The loss with the LM head sharded over the vocabulary (tensor parallel): one shard per process.

Each of the P processes of ``process_group`` holds the same hidden states and targets and
its own rows ``[start, start + V_p)`` of the (V, H) weight (and of the bias). The loss runs
the single-process passes (:mod:`fusedce.passes`) over the local shard, with the vocabulary
offset and the global V given to them (:class:`fusedce.passes.VocabShard`), and two hooks
that communicate what one process would have summed over the columns it does not hold:

**Forward**, after each row chunk of R tokens (its local blocks done), with (m_p, s_p) the
local running max and Σexp of a token:

1. all-reduce MAX of the row max: M = max_p m_p;
2. one packed all-reduce SUM of (s_p·exp(m_p − M), c_y, Σc), a (3, R) (or (2, R) without
   label smoothing) buffer in the accumulation dtype: Σexp relative to M, the target's logit
   (only the shard holding y adds a non-zero value), and Σ_v c_v for label smoothing.

Then lse = M + log Σ_p s_p·exp(m_p − M) and the loss is every process's, identical: the
label-smoothing mean divides by the global V, targets are global ids, a target outside
[0, V) that is not ``ignore_index`` is an IndexError on the CPU / NaN on CUDA as in one process.

**Backward**: per block the logit gradients use the global lse and V, so grad_W and grad_b
stay local (each process's rows, no communication); grad_hidden of each row chunk is summed
over the local vocabulary chunks in fp32, then all-reduced SUM in fp32 (one all-reduce per
row chunk), then rounded to hidden's dtype. Every process ends with the full grad_hidden:
do not all-reduce it again upstream (no Megatron-style "copy to tensor-parallel region").

Memory per process: the inputs N·H + (V/P)·H, their gradients, one block and the (3, R)
buffer (:func:`fusedce.memory_model.predict_vocab_parallel_peak_bytes`). The chunk plan is
taken for the largest shard, ceil(V/P) rows, so every process makes the same number of
collectives in the same order. Reproducible: the blocks and the reductions run in a fixed
order, so equal inputs give bitwise-equal results run after run, and every process holds
bitwise the same loss and grad_hidden (an all-reduce hands every rank the same sum).

**DTensor**: a weight that is a ``DTensor`` placed ``Shard(0)`` on a 1-D mesh is unwrapped
at the boundary (``to_local()``; its offset from ``torch.chunk``'s split, the one DTensor
uses, so V = 37 over 3 processes is 13 + 13 + 11); its gradient comes back through
``to_local``'s backward as a DTensor with the same placement. A bias may be a ``Shard(0)``
DTensor too; hidden states and targets may be ``Replicate()`` DTensors. The loss is a plain
tensor, the same on every process.

**torch.compile**: the collectives are ordinary ``torch.distributed`` calls inside a
``torch.autograd.Function``, which Dynamo cannot treat as one opaque op the way the
single-process loss's custom op is treated (a custom op must not communicate: its fake
implementation, functionalisation and re-ordering passes assume it does not). The public
function is therefore ``torch.compiler.disable``'d: a compiled model graph-breaks around
the loss and runs it eagerly, forward and backward, with the same kernels as without
compile.

Public API: :func:`vocab_parallel_linear_cross_entropy`, :func:`vocab_shard_bounds`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist

from fusedce import passes
from fusedce.api import _compute_dtype, _reduce, _resolve_impl, _AUTOCASTABLE
from fusedce.custom_op import _block_math
from fusedce.options import IGNORE_INDEX, LossOptions
from fusedce.planner import ChunkPlan, plan_chunks
from fusedce.stats import RowStats
from fusedce.validation import check_tensors, is_dtensor, raise_on_out_of_range_targets


def vocab_shard_bounds(vocab_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)``: the rows of a ``vocab_size``-row weight that ``rank`` of
    ``world_size`` holds under ``torch.chunk``'s split (DTensor's ``Shard(0)``, FSDP2):
    chunks of ceil(V/P) rows, the last ones shorter or empty (V = 37, P = 3: 13, 13, 11;
    V = 2, P = 3: 1, 1, 0)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")
    chunk = -(-vocab_size // world_size)
    start = min(rank * chunk, vocab_size)
    return start, min(start + chunk, vocab_size)


@torch.compiler.disable
def vocab_parallel_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    process_group: dist.ProcessGroup | None = None,
    vocab_start: int | None = None,
    vocab_size: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    impl: str = "auto",
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
    memory_budget: int | None = None,
    validate_targets: bool | None = None,
) -> torch.Tensor:
    """:func:`fusedce.linear_cross_entropy` of a head whose vocabulary is sharded over processes.

    Called by every process of ``process_group`` with the same hidden states, targets and
    options; the value and gradients are those of ``linear_cross_entropy`` on the whole
    (V, H) weight, up to the order of the sums (see the module docstring).

    Args:
        hidden: (..., H), the same on every process (or a ``Replicate()`` DTensor).
        weight: this process's shard (V_p, H) of the (V, H) weight, or the whole weight as a
            DTensor placed ``Shard(0)`` on a 1-D mesh (then ``process_group``,
            ``vocab_start`` and ``vocab_size`` come from it; if given they must agree).
        target: hidden.shape[:-1], global class ids in [0, V) or ``ignore_index``.
        bias: optional shard (V_p,) (a ``Shard(0)`` DTensor with a DTensor weight).
        process_group: the processes sharing the vocabulary (default: the default group).
        vocab_start: the global id of the shard's first row (default: ``torch.chunk``'s
            split, :func:`vocab_shard_bounds`; give it for any other split).
        vocab_size: the global V (required with a plain-tensor shard).
        The other options: as :func:`fusedce.linear_cross_entropy`.

    Returns:
        fp32 loss (fp64 for fp64 inputs), a plain tensor identical on every process: a
        scalar, or ``target.shape`` for ``reduction="none"``. Gradients: grad_hidden the
        full one on every process; grad_weight / grad_bias the shard's (a ``Shard(0)``
        DTensor for a DTensor weight / bias).
    """
    opts = LossOptions(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap)
    local = _local_inputs(hidden, weight, target, bias, process_group, vocab_start, vocab_size)
    check_tensors(local.hidden, local.weight, local.target, local.bias, min_vocab=0)
    impl = _resolve_impl(impl, local.hidden.device)
    compute_dtype = _compute_dtype(local.hidden, local.weight)
    if impl == "triton" and compute_dtype not in _AUTOCASTABLE:
        raise TypeError(f"impl='triton' computes in float32/bfloat16/float16; got inputs needing {compute_dtype}")

    h = local.weight.shape[1]
    hidden2d = local.hidden.reshape(-1, h)
    target1d = local.target.reshape(-1).to(torch.int64)
    if validate_targets or (validate_targets is None and local.hidden.device.type != "cuda"):
        raise_on_out_of_range_targets(target1d, local.vocab_size, ignore_index)
    largest_shard = -(-local.vocab_size // local.world_size)  # the same plan on every process
    plan = plan_chunks(hidden2d.shape[0], h, largest_shard, hidden_dtype=local.hidden.dtype,
                       weight_dtype=local.weight.dtype, compute_dtype=compute_dtype, chunk_size=chunk_size,
                       vocab_chunk_size=vocab_chunk_size, memory_budget=memory_budget)
    call = _Call(opts=opts, compute_dtype=compute_dtype, plan=plan, block_math=_block_math(impl),
                 shard=_Collectives(local.group).shard(local.vocab_start, local.vocab_size))
    per_token = VocabParallelLinearCrossEntropyFunction.apply(hidden2d, local.weight, target1d, local.bias, call)
    return _reduce(per_token, local.target, target1d, reduction, ignore_index)


@dataclass(frozen=True)
class _Call:
    """What one call of the loss runs with, besides its tensors."""

    opts: LossOptions
    compute_dtype: torch.dtype
    plan: ChunkPlan
    block_math: ModuleType
    shard: passes.VocabShard


class VocabParallelLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd of the vocabulary-parallel loss: per-token losses (N,) from hidden (N, H),
    the weight shard (V_p, H), targets (N,) int64 and the bias shard (V_p,) or None.

    Forward saves the inputs and the per-token lse (N floats), like the single-process op.
    Both passes run with autocast off: the compute dtype was fixed at the call, as the
    custom op's argument is. Every process must ask for the same gradients (the grad_hidden
    all-reduce runs only when hidden requires grad).
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, call: _Call):
        with _autocast_off(hidden.device.type):
            per_token, lse = passes.forward(hidden, weight, target, bias, call.opts, call.compute_dtype, call.plan,
                                            call.block_math, shard=call.shard)
        ctx.save_for_backward(hidden, weight, target, bias, lse)
        ctx.call = call
        return per_token

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, target, bias, lse = ctx.saved_tensors
        call: _Call = ctx.call
        need = ctx.needs_input_grad
        with _autocast_off(hidden.device.type):
            gh, gw, gb = passes.backward(grad_loss, hidden, weight, target, bias, lse, call.opts, call.compute_dtype,
                                         call.plan, call.block_math, need_hidden=need[0], need_weight=need[1],
                                         need_bias=bias is not None and need[3], shard=call.shard)
        return gh, gw, None, gb, None


class _Collectives:
    """The two reductions of :class:`fusedce.passes.VocabShard` over ``group`` (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def shard(self, start: int, size: int) -> passes.VocabShard:
        return passes.VocabShard(start=start, size=size, reduce_stats=self.reduce_stats,
                                 reduce_hidden=self.reduce_hidden)

    def reduce_stats(self, stats: RowStats, need_sum: bool) -> None:
        """In place, (R,) statistics over the local columns → over the whole vocabulary.

        With M = max_p m_p: Σexp = Σ_p s_p·exp(m_p − M) (an empty shard has m_p = −inf,
        s_p = 0 and adds 0); c_y and Σc are plain sums (c_y is 0 off the target's shard).
        One (k, R) buffer: its first row holds m_p while the MAX runs, then the rescaled s_p.
        """
        rows = 3 if need_sum else 2
        packed = torch.empty(rows, stats.max.shape[0], device=stats.max.device, dtype=stats.max.dtype)
        packed[0].copy_(stats.max)
        dist.all_reduce(stats.max, op=dist.ReduceOp.MAX, group=self.group)
        packed[0].sub_(stats.max).exp_().mul_(stats.sumexp)
        packed[1].copy_(stats.target_logit)
        if need_sum:
            packed[2].copy_(stats.logit_sum)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=self.group)
        stats.sumexp.copy_(packed[0])
        stats.target_logit.copy_(packed[1])
        if need_sum:
            stats.logit_sum.copy_(packed[2])

    def reduce_hidden(self, hidden_sum: torch.Tensor) -> None:
        """In place: one row chunk's (R, H) grad_hidden, accumulation dtype, summed over the shards."""
        dist.all_reduce(hidden_sum, op=dist.ReduceOp.SUM, group=self.group)


@dataclass(frozen=True)
class _Local:
    """The call's tensors as this process's plain tensors, and where its shard lies."""

    hidden: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    bias: torch.Tensor | None
    group: dist.ProcessGroup
    world_size: int
    vocab_start: int
    vocab_size: int


def _local_inputs(hidden, weight, target, bias, process_group, vocab_start, vocab_size) -> _Local:
    """Unwrap DTensors (``to_local()``, differentiable: gradients go back as DTensors) and
    find the shard's offset; ``ValueError``/``TypeError`` naming what does not fit."""
    if is_dtensor(weight):
        group, world, start, size = _dtensor_shard(weight, "weight", process_group, vocab_start, vocab_size)
        if is_dtensor(bias):
            if bias.device_mesh != weight.device_mesh:
                raise ValueError("bias and weight must be DTensors on the same device mesh")
            _dtensor_shard(bias, "bias", group, start, size)
            bias = bias.to_local()
        weight = weight.to_local()
    else:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("vocab_parallel_linear_cross_entropy needs an initialised torch.distributed "
                               "process group (torch.distributed.init_process_group)")
        group = process_group if process_group is not None else dist.group.WORLD
        if vocab_size is None:
            raise ValueError("vocab_size (the global V) is required when weight is this process's shard")
        world, size = dist.get_world_size(group), vocab_size
        start = vocab_start
        if start is None:
            start, stop = vocab_shard_bounds(vocab_size, world, dist.get_rank(group))
            if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] != stop - start:
                raise ValueError(
                    f"weight has {weight.shape[0]} rows but torch.chunk's split of V={vocab_size} over {world} "
                    f"processes gives this rank {stop - start}; pass vocab_start for any other split")
        if is_dtensor(bias):
            raise TypeError("bias is a DTensor but weight is a plain tensor: pass both as DTensors or both plain")
    hidden, target = _replicated(hidden, "hidden"), _replicated(target, "target")
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        if start < 0 or start + weight.shape[0] > size:
            raise ValueError(f"the shard's rows [{start}, {start + weight.shape[0]}) are not inside "
                             f"[0, vocab_size={size})")
    return _Local(hidden=hidden, weight=weight, target=target, bias=bias, group=group, world_size=world,
                  vocab_start=start, vocab_size=size)


def _dtensor_shard(t, name: str, process_group, vocab_start, vocab_size) -> tuple[dist.ProcessGroup, int, int, int]:
    """(group, world size, start, V) of a ``Shard(0)`` DTensor on a 1-D mesh, checked against
    the arguments given alongside it."""
    mesh, placements = t.device_mesh, t.placements
    if mesh.ndim != 1 or len(placements) != 1 or not placements[0].is_shard(0):
        raise ValueError(f"{name} must be a DTensor placed (Shard(0),) on a 1-D device mesh (a head sharded "
                         f"over the vocabulary); got placements {tuple(placements)} on a {mesh.ndim}-D mesh")
    group = mesh.get_group()
    if process_group is not None and process_group is not group:
        raise ValueError(f"process_group is not the group of {name}'s device mesh; leave it out")
    world, rank = mesh.size(), mesh.get_local_rank()
    size = t.shape[0]
    start, stop = vocab_shard_bounds(size, world, rank)
    if vocab_size is not None and vocab_size != size:
        raise ValueError(f"vocab_size={vocab_size} but {name} is a DTensor of {size} rows")
    if vocab_start is not None and vocab_start != start:
        raise ValueError(f"vocab_start={vocab_start} but {name}'s shard on this rank starts at row {start}")
    if t.to_local().shape[0] != stop - start:  # not torch.chunk's split: DTensor would not make one
        raise ValueError(f"{name}'s local shard has {t.to_local().shape[0]} rows, expected {stop - start}")
    return group, world, start, size


def _replicated(t, name: str):
    """A ``Replicate()`` DTensor's local tensor (``t`` itself when it is a plain tensor)."""
    if not is_dtensor(t):
        return t
    if not all(p.is_replicate() for p in t.placements):
        raise ValueError(
            f"{name} must be the same on every process (a plain tensor or a Replicate() DTensor); got placements "
            f"{tuple(t.placements)}. Sequence-parallel hidden states: redistribute them to Replicate() first "
            "(the loss's grad_hidden is already the full gradient on every process)")
    return t.to_local()


def _autocast_off(device_type: str):
    if device_type in ("cuda", "cpu"):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
