"""The chunked forward and backward passes (shared by the PyTorch and Triton paths).

Notation: N tokens, H hidden size, V vocabulary; x = hidden @ weight.T (+ bias) the raw
logits, c = softcap(x) what the loss sees, lse = logsumexp(c). The matrix products run on
torch (cuBLAS/CPU BLAS) in the compute dtype with an fp32 result; the softmax math on each
``rows × cols`` block runs in a :class:`~fusedce.block_math.BlockMath` (Triton kernels or
plain PyTorch).

Forward (2·N·H·V FLOPs): for each block, x = h_i @ W_jᵀ, then fold it into the per-token
running statistics (max, Σexp, c_y, Σc). Only the statistics (N floats each) survive; the
per-token loss and lse are returned, and lse is saved for backward. Where tiled kernels run
(:class:`~fusedce.block_math.TileMath`), a row chunk's forward takes one launch for the whole
vocabulary (or, under autocast, one per chunk of converted weight rows the block buffer holds).

Backward (6·N·H·V FLOPs): for each block, recompute x, turn it in place into
d = g_n · ∂L_n/∂x (g the per-token upstream gradient), then
    grad_hidden[i]  += d @ W_j          (fp32 accumulator over vocabulary chunks)
    grad_weight[j]  += dᵀ @ h_i         (in the fp32 output, or written once)
    grad_bias[j]    += Σ_rows d
Nothing of size N×V is ever allocated: the largest temporary is one fp32 block.

A plan with kept logits (:mod:`fusedce.kept_plan`) passes an (N, K) compute-dtype tensor ``kept``: the
forward writes the raw logits of the columns [0, K) into it and folds their statistics from it; the
backward's blocks there compute their gradients from it, into the block buffer (``kept`` stays as it
is, so a second backward reads the same logits), and skip the product.

Vocabulary-parallel runs (:mod:`fusedce.parallel`) pass a :class:`VocabShard`: the weight
is then one process's rows ``[start, start + V_local)`` of a ``size``-entry vocabulary,
targets are global ids, and the shard's two hooks reduce across processes what a single
process would have summed over the missing vocabulary chunks (the row statistics after each
row chunk in forward, each row chunk's fp32 grad_hidden in backward). The passes themselves
never communicate.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

from fusedce.block_math import BlockMath, TileMath
from fusedce.block_workspace import BlockWorkspace
from fusedce.kept_plan import kept_columns
from fusedce.matmul import matmul_into
from fusedce.options import LossOptions
from fusedce.planner import ChunkPlan, block_row_stride  # noqa: F401 (block_row_stride: re-exported)
from fusedce.stats import RowStats
from fusedce.validation import out_of_range_targets, outside_vocabulary
from fusedce.wide_forward import converting_tile_math, stats_in_wide_chunks


def accumulation_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype of every sum: fp64 for fp64 compute, else fp32."""
    return torch.float64 if compute_dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class VocabShard:
    """The slice of a vocabulary sharded over processes that this process's weight holds.

    ``start``: the global id of the weight's first row; ``size``: the global V (for ε/V, the
    range check of the targets and the label-smoothing mean). ``reduce_stats(stats, need_sum)``
    turns one row chunk's statistics over the local columns into those over the whole
    vocabulary, in place (:class:`~fusedce.stats.RowStats` of R rows; ``logit_sum`` only when
    ``need_sum``). ``reduce_hidden(hidden_sum)`` sums one row chunk's (R, H) fp32 grad_hidden
    over the processes, in place. Every process must make the same calls in the same order.
    """

    start: int
    size: int
    reduce_stats: Callable[[RowStats, bool], None]
    reduce_hidden: Callable[[torch.Tensor], None]


def forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    opts: LossOptions,
    compute_dtype: torch.dtype,
    plan: ChunkPlan,
    block_math: BlockMath,
    *,
    shard: VocabShard | None = None,
    kept: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and logsumexp, both (N,) in the accumulation dtype.

    hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None. Ignored tokens get
    loss 0; tokens whose target is out of range (and not ignored) get NaN. With ``shard``,
    weight and bias are the shard's rows and the results are over the whole vocabulary.
    ``kept``: (N, K) in the compute dtype, contiguous, filled with hidden @ weight[:K]ᵀ (the
    weight already in the compute dtype).
    """
    n, _ = hidden.shape
    v = weight.shape[0]
    vocab, offset = (v, 0) if shard is None else (shard.size, shard.start)
    target, bias = _contiguous_vectors(target, bias)
    acc = accumulation_dtype(compute_dtype)
    stats = RowStats.empty(n, hidden.device, acc)
    work = BlockWorkspace(plan, hidden, weight, compute_dtype, acc)
    tiles = _tile_math(block_math, weight, compute_dtype)
    converting = converting_tile_math(block_math, weight, compute_dtype)
    need_sum = opts.label_smoothing > 0
    kept_cols = kept_columns(kept, weight, compute_dtype)
    rest, rest_bias = weight[kept_cols:], None if bias is None else bias[kept_cols:]
    for r0, r1 in plan.row_chunks(n):  # a row chunk's slices are made once, not once per block
        h_i, target_i, stats_i = work.hidden_rows(r0, r1), target[r0:r1], stats.rows(r0, r1)
        for c0, c1 in plan.col_chunks(kept_cols):
            z = kept[r0:r1, c0:c1]
            matmul_into(z, h_i, work.weight_rows(c0, c1).t(), accumulate=False)
            block_math.chunk_stats(z, _columns(bias, c0, c1), offset + c0, target_i, stats_i,
                                   softcap=opts.softcap_value, need_sum=need_sum)
        whole = kept_cols == v or (  # the other columns in one launch, its partials where the fp32 block would be
            tiles is not None and tiles.tiles_supported(h_i, rest)
            and tiles.partial_bytes(r1 - r0, v - kept_cols) <= work.block_bytes
            and tiles.tile_stats(h_i, rest, rest_bias, offset + kept_cols, target_i, stats_i, work.block,
                                 softcap=opts.softcap_value, need_sum=need_sum))
        done = v if whole else kept_cols  # the vocabulary columns [0, done) are folded into stats_i
        if converting is not None:
            done = stats_in_wide_chunks(converting, work, h_i, weight, bias, offset, target_i, stats_i,
                                         softcap=opts.softcap_value, need_sum=need_sum, plan_cols=plan.cols)
        for c0, c1 in plan.col_chunks(v, start=done):
            w_j = work.weight_rows(c0, c1)
            if (tiles is not None and tiles.tiles_supported(h_i, w_j)
                    and tiles.tile_stats(h_i, w_j, _columns(bias, c0, c1), offset + c0, target_i, stats_i,
                                         work.block, softcap=opts.softcap_value, need_sum=need_sum)):
                continue
            for s0, s1 in work.logit_pieces(r1 - r0, c0, c1):
                z = work.logits(h_i, w_j[s0 - c0:s1 - c0])
                block_math.chunk_stats(z, _columns(bias, s0, s1), offset + s0, target_i, stats_i,
                                       softcap=opts.softcap_value, need_sum=need_sum)
        if shard is not None:
            shard.reduce_stats(stats.rows(r0, r1), need_sum)
    lse = stats.logsumexp()
    return _token_loss(stats, lse, target, vocab, opts), lse


def backward(
    grad_loss: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    lse: torch.Tensor,
    opts: LossOptions,
    compute_dtype: torch.dtype,
    plan: ChunkPlan,
    block_math: BlockMath,
    *,
    need_hidden: bool = True,
    need_weight: bool = True,
    need_bias: bool = True,
    shard: VocabShard | None = None,
    kept: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients (grad_hidden (N, H), grad_weight (V, H), grad_bias (V,)) in each input's dtype.

    ``grad_loss`` (N,) is the upstream gradient of each token's loss (mean/sum/none all reduce
    to this); ``lse`` (N,) is forward's. A gradient not asked for is None. For fp16 compute
    the blocks' gradients are scaled by a power of two (:func:`_row_scale`). With ``shard``,
    grad_weight and grad_bias are the shard's rows and grad_hidden is summed over the shards.
    A split plan (:meth:`~fusedce.planner.ChunkPlan.hidden_pass`) runs grad_hidden's blocks first,
    then grad_weight's and grad_bias's (:mod:`fusedce.split_plan`). ``kept``: forward's (N, K) logits
    of the columns [0, K) (:func:`forward`), read, never written.
    """
    hidden_pass = plan.hidden_pass()
    need_bias = need_bias and bias is not None
    if hidden_pass is not None and kept is not None:
        raise ValueError("a plan with kept logits runs its backward in one pass")
    if hidden_pass is not None and need_hidden and (need_weight or need_bias):
        def run(one_pass: ChunkPlan, **needs: bool):
            return backward(grad_loss, hidden, weight, target, bias, lse, opts, compute_dtype, one_pass, block_math,
                            shard=shard, **needs)

        grad_hidden, _, _ = run(hidden_pass, need_weight=False, need_bias=False)
        _, grad_weight, grad_bias = run(plan.weight_pass(), need_hidden=False, need_weight=need_weight,
                                        need_bias=need_bias)
        return grad_hidden, grad_weight, grad_bias
    plan = hidden_pass if hidden_pass is not None and need_hidden else plan.weight_pass()
    n = hidden.shape[0]
    v = weight.shape[0]
    vocab, offset = (v, 0) if shard is None else (shard.size, shard.start)
    target, bias = _contiguous_vectors(target, bias)
    acc = accumulation_dtype(compute_dtype)
    counted, out_of_range = _token_masks(target, vocab, opts.ignore_index)
    row_scale, scale = _row_scale(grad_loss, counted, out_of_range, acc, compute_dtype)
    row_chunks = plan.row_chunks(n)
    grads = _Gradients.allocate(hidden, weight, acc, several_row_chunks=len(row_chunks) > 1,
                                per_chunk=plan.per_chunk, need_hidden=need_hidden, need_weight=need_weight,
                                need_bias=need_bias)
    work = BlockWorkspace(plan, hidden, weight, compute_dtype, acc, hidden_sum=need_hidden,
                          ones=grads.bias is not None)
    kept_cols = kept_columns(kept, weight, compute_dtype)
    col_chunks = dataclasses.replace(plan, kept_cols=kept_cols).col_chunks(v)
    tiles = _backward_tile_math(block_math)
    for i, (r0, r1) in enumerate(row_chunks):
        h_i = work.hidden_rows(r0, r1)
        target_i, lse_i, row_scale_i = target[r0:r1], lse[r0:r1], row_scale[r0:r1]
        hidden_sum = work.hidden_sum_rows(r1 - r0)
        if hidden_sum is not None and not col_chunks:  # an empty vocabulary shard adds nothing
            hidden_sum.zero_()
        for k, (c0, c1) in enumerate(col_chunks):
            w_j = work.weight_rows(c0, c1)
            d = None
            if c1 <= kept_cols:  # gradients from the kept logits, into the block buffer
                d = block_math.logit_grad(kept[r0:r1, c0:c1], _columns(bias, c0, c1), offset + c0, target_i, lse_i,
                                          row_scale_i, vocab=vocab, label_smoothing=opts.label_smoothing,
                                          z_loss=opts.z_loss, softcap=opts.softcap_value, out_dtype=compute_dtype,
                                          out=work.narrow_block(r1 - r0, c1 - c0, compute_dtype))
            elif tiles is not None and tiles.tiles_supported(h_i, w_j):
                d = tiles.tile_grad(h_i, w_j, _columns(bias, c0, c1), offset + c0, target_i, lse_i, row_scale_i,
                                    work.narrow_block(r1 - r0, c1 - c0, compute_dtype), vocab=vocab,
                                    label_smoothing=opts.label_smoothing, z_loss=opts.z_loss,
                                    softcap=opts.softcap_value)
            if d is not None:
                grads.add_block(d, h_i, w_j, c0, c1, hidden_sum, work.ones, first_vocab_chunk=k == 0,
                                first_row_chunk=i == 0)
                continue
            for s0, s1 in work.logit_pieces(r1 - r0, c0, c1):
                w_s = w_j[s0 - c0:s1 - c0]
                d = block_math.logit_grad(work.logits(h_i, w_s), _columns(bias, s0, s1), offset + s0, target_i,
                                          lse_i, row_scale_i, vocab=vocab, label_smoothing=opts.label_smoothing,
                                          z_loss=opts.z_loss, softcap=opts.softcap_value, out_dtype=compute_dtype)
                grads.add_block(d, h_i, w_s, s0, s1, hidden_sum, work.ones, first_vocab_chunk=k == 0 and s0 == c0,
                                first_row_chunk=i == 0)
                del d  # the PyTorch path's d is a copy: free it before the next block's product
        if hidden_sum is not None:
            grads.store_hidden_rows(r0, r1, hidden_sum, scale,
                                    reduce=None if shard is None else shard.reduce_hidden)
    return grads.finish(scale, weight.dtype, None if bias is None else bias.dtype)


def _token_loss(stats: RowStats, lse: torch.Tensor, target: torch.Tensor, v: int, opts: LossOptions) -> torch.Tensor:
    """Each token's loss (N,) in the accumulation dtype, from its statistics and ``lse`` (N,):
    (1 − ε)(lse − c_y) + ε(lse − Σc/V) + λ·lse²; 0 for ignored tokens, NaN for out-of-range targets."""
    eps = opts.label_smoothing
    loss = (1.0 - eps) * (lse - stats.target_logit)
    if eps:
        loss = loss + eps * (lse - stats.logit_sum / v)
    if opts.z_loss:
        loss = loss + opts.z_loss * lse * lse
    loss = torch.where(target == opts.ignore_index, 0.0, loss)
    return torch.where(out_of_range_targets(target, v, opts.ignore_index), math.nan, loss)


def _token_masks(target: torch.Tensor, v: int, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean (N,) masks: the tokens that count (not ``ignore_index``) and, of those, the
    ones whose target is outside [0, V)."""
    counted = target != ignore_index
    return counted, outside_vocabulary(target, v) & counted


def _row_scale(grad_loss: torch.Tensor, counted: torch.Tensor, out_of_range: torch.Tensor, acc: torch.dtype,
               compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The factor of each token's logit gradients, (N,) in ``acc``, and the power of two it was
    divided by (0-d ``acc``; None unless the compute dtype is fp16).

    The factor is the upstream gradient ``grad_loss`` (N,), 0 for tokens that do not count
    and NaN for out-of-range targets. For fp16 compute the block gradients would underflow
    fp16 for small upstream gradients (1/N for ``mean``), so the factor is divided by
    2ᵏ ≥ max|grad_loss| and :meth:`_Gradients.finish` multiplies the sums back, exactly, in fp32.
    """
    row_scale = torch.where(counted, grad_loss.to(acc), 0.0)
    row_scale = torch.where(out_of_range, math.nan, row_scale)
    scale = None
    if compute_dtype == torch.float16 and row_scale.numel():
        peak = row_scale.abs().amax()
        scale = torch.where(peak > 0, torch.exp2(torch.ceil(torch.log2(peak))), 1.0)
        row_scale = row_scale / scale
    return row_scale, scale


@dataclass
class _Gradients:
    """The backward's outputs and the sums they are built from, allocated before the first block.

    ``hidden``: (N, H) in hidden's dtype; each row chunk is written once, from its sum over
    the vocabulary chunks. ``weight``: (V, H) in weight's dtype, zeros; None while
    ``weight_sum`` is a separate copy (then cast into it at the end). ``weight_sum``: where
    each block's dᵀ @ h_i is added: ``weight`` itself when weight's dtype is the accumulation
    dtype (an fp32 master weight); a (V, H) accumulation-dtype copy when a bf16/fp16 weight's
    rows come in several row chunks (only when ``chunk_size`` forces it); None when all rows
    are one chunk, so each vocabulary chunk of ``weight`` is written once (one rounding), or
    with ``per_chunk`` (each row chunk's product added into ``weight``: one rounding per row
    chunk, ``grad_weight_accumulation="per_chunk"``).
    ``bias``: (V,) the accumulation-dtype column sums of the blocks' d; cast to bias's dtype
    at the end. Each is None when not asked for.
    """

    hidden: torch.Tensor | None
    weight: torch.Tensor | None
    weight_sum: torch.Tensor | None
    bias: torch.Tensor | None

    @classmethod
    def allocate(cls, hidden: torch.Tensor, weight: torch.Tensor, acc: torch.dtype, *, several_row_chunks: bool,
                 need_hidden: bool, need_weight: bool, need_bias: bool, per_chunk: bool = False) -> "_Gradients":
        """Allocate, in this order: the weight gradient (or its sum), grad_hidden, the bias sum."""
        (n, h), v, device = hidden.shape, weight.shape[0], hidden.device
        if weight.dtype == acc or not several_row_chunks or per_chunk:
            grad_weight = torch.zeros(v, h, device=device, dtype=weight.dtype) if need_weight else None
            weight_sum = grad_weight if weight.dtype == acc else None
        else:
            grad_weight = None
            weight_sum = torch.zeros(v, h, device=device, dtype=acc) if need_weight else None
        grad_hidden = torch.empty(n, h, device=device, dtype=hidden.dtype) if need_hidden else None
        bias_sum = torch.zeros(v, device=device, dtype=acc) if need_bias else None
        return cls(hidden=grad_hidden, weight=grad_weight, weight_sum=weight_sum, bias=bias_sum)

    def add_block(self, d: torch.Tensor, h_i: torch.Tensor, w_j: torch.Tensor, c0: int, c1: int,
                  hidden_sum: torch.Tensor | None, ones: torch.Tensor | None, *, first_vocab_chunk: bool,
                  first_row_chunk: bool = True) -> None:
        """Add one block's share: bias[c0:c1] += 1ᵀ d; ``hidden_sum`` (R, H) in the accumulation
        dtype += d @ w_j (= on the first vocabulary chunk); weight[c0:c1] += dᵀ @ h_i (= on
        the first row chunk when ``weight`` is written directly).

        d (R, C), h_i (R, H) and w_j (C, H) are in the compute dtype; ``ones`` (≥ R,) too.
        """
        if self.bias is not None:  # column sums as a (1, R) @ (R, C) product: no fp32 copy of the block
            matmul_into(self.bias[c0:c1].view(1, -1), ones[: d.shape[0]].view(1, -1), d, accumulate=True)
        if hidden_sum is not None:
            matmul_into(hidden_sum, d, w_j, accumulate=not first_vocab_chunk)
        if self.weight_sum is not None:
            matmul_into(self.weight_sum[c0:c1], d.t(), h_i, accumulate=True)
        elif self.weight is not None and not first_row_chunk:  # per_chunk: rounded once per row chunk
            matmul_into(self.weight[c0:c1], d.t(), h_i, accumulate=True)
        elif self.weight is not None:
            _write_product(self.weight[c0:c1], d.t(), h_i)

    def store_hidden_rows(self, r0: int, r1: int, hidden_sum: torch.Tensor, scale: torch.Tensor | None,
                          reduce: Callable[[torch.Tensor], None] | None = None) -> None:
        """grad_hidden[r0:r1] = ``hidden_sum`` (R, H), times the fp16 ``scale``, summed over the
        vocabulary shards by ``reduce`` (in the accumulation dtype), rounded to hidden's dtype."""
        if scale is not None:
            hidden_sum.mul_(scale)
        if reduce is not None:
            reduce(hidden_sum)
        self.hidden[r0:r1] = hidden_sum

    def finish(self, scale: torch.Tensor | None, weight_dtype: torch.dtype, bias_dtype: torch.dtype | None
               ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(grad_hidden, grad_weight, grad_bias): the sums times the fp16 ``scale``, cast to the inputs' dtypes."""
        if self.weight_sum is not None or self.weight is not None:
            if scale is not None and self.weight_sum is not None:
                self.weight_sum.mul_(scale)
            elif scale is not None:
                self.weight.mul_(scale.to(self.weight.dtype))
            if self.weight is None:
                self.weight = self.weight_sum.to(weight_dtype)
        if self.bias is not None:
            if scale is not None:
                self.bias.mul_(scale)
            self.bias = self.bias.to(bias_dtype)
        return self.hidden, self.weight, self.bias


def _tile_math(block_math: BlockMath, weight: torch.Tensor, compute_dtype: torch.dtype) -> TileMath | None:
    """The block math's tiled kernels (product and softmax math in one kernel) for every block of
    the forward: a weight already in the compute dtype (pure bf16/fp16). Under autocast (an fp32
    weight converted chunk by chunk) a tiled forward launch per block (partials, then a merge)
    measured slower at the 8192×768×32777 head (13.8 ms against 7.8,
    ``benchmarks/results/tiles-h200-2026-12-04/``: the host's cost of the launches); there the forward
    uses them in wide chunks (:func:`fusedce.wide_forward.converting_tile_math`), the backward per block
    (:func:`_backward_tile_math`)."""
    if weight.dtype != compute_dtype or not isinstance(block_math, TileMath):
        return None
    return block_math


def _backward_tile_math(block_math: BlockMath) -> TileMath | None:
    """The block math's tiled kernels for the backward's blocks, on the weight as it is or on its
    converted chunks (an fp32 weight under autocast): one launch computes a block's gradients from
    its operands, where a product and a block kernel went through the fp32 logits, and the block
    holds twice the columns (8192×768×32777 in amp: 4.62 → 3.86 ms,
    ``benchmarks/results/amp-tiles-probe-h100-2026-12-05/``)."""
    return block_math if isinstance(block_math, TileMath) else None


def _contiguous_vectors(target: torch.Tensor, bias: torch.Tensor | None):
    """The kernels index target and bias with unit stride (copies only strided inputs, O(N + V))."""
    return target.contiguous(), (None if bias is None else bias.contiguous())


def _columns(bias: torch.Tensor | None, c0: int, c1: int) -> torch.Tensor | None:
    """``bias[c0:c1]``, the bias of one vocabulary chunk (None without a bias)."""
    return None if bias is None else bias[c0:c1]


def _write_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out = a @ b, rounded once to out's dtype (fp32 accumulation inside the GEMM)."""
    if out.dtype == a.dtype:
        matmul_into(out, a, b, accumulate=False)
    else:
        tmp = torch.empty(out.shape, device=out.device, dtype=accumulation_dtype(a.dtype))
        matmul_into(tmp, a, b, accumulate=False)
        out.copy_(tmp)
