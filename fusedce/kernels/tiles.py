"""Kernels: a block's logits multiplied and finished tile by tile, never stored as fp32.

The other kernels of this package work on an fp32 block of raw logits that cuBLAS wrote:
the product writes 4 bytes per logit and the softmax pass reads them back (8 bytes a logit
per pass, plus a launch per block). Here one Triton kernel computes an output tile
``x = h[rows] @ w[cols]ᵀ`` (bf16/fp16 operands, fp32 accumulator, Hopper's tensor-memory
copies) and applies the softmax math to it in registers:

- :func:`tile_stats` (forward): per (row, tile of ``TILE_N`` columns) the tile's maximum,
  Σ exp(c − max), its c_y and (label smoothing) Σ c, stored as ``(R, T)`` partials; a second
  kernel folds the T partials of each row, in tile order, into the running
  :class:`~fusedce.stats.RowStats`. Fixed tile sizes and a fixed merge order: the result is
  bitwise reproducible.
- :func:`tile_grad` (backward): d = row_scale · ∂L/∂x, written once in the compute dtype for the
  cuBLAS products that follow (grad_hidden and grad_weight).

Measured on an H200 (``benchmarks/results/fused-epilogue-h200-2026-12-04/``): the forward of
8192×768×32777 in 1.21 ms against 1.65 (cuBLAS + :mod:`fusedce.kernels.chunk_stats`), the
backward in 2.53 ms against 2.94; at 8192×4096×128256 15.3 against 15.7 and 41.8 against 42.6.

The math is :mod:`fusedce.block_math`'s (the same formulas as ``chunk_stats`` and
``logit_grad``). The kernel is persistent: one program per SM walks the tiles, grouped
``GROUP_M`` row tiles at a time so a weight tile is reused from L2.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fusedce.kernels.activation import activate
from fusedce.kernels.running import fold_into_row
from fusedce.stats import RowStats

TILE_M, TILE_N, TILE_K = 128, 256, 64  # fixed (not autotuned): a tile's size decides the rounding
GROUP_M = 8
STAGES, WARPS = 3, 8
PARTIALS = 4  # per (row, tile): max, Σexp, c_y, Σc
MERGE_BLOCK = 256


@triton.jit
def _tile_of(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of the tile-th tile: GROUP_M row tiles share each column tile in turn."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size_m, (tile % group) // size_m


@triton.jit
def logit_tiles_kernel(
    h_desc, w_desc, M, N, K, num_programs,
    bias_ptr, target_ptr, col0,
    part_ptr, part_stride, part_plane,
    lse_ptr, row_scale_ptr, d_ptr, d_row_stride, inv_vocab, label_smoothing, z_loss,
    softcap,
    GRAD: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, NEED_SUM: tl.constexpr,
    TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """x = h @ wᵀ tile by tile; h (M, K) and w (N, K) through tensor descriptors (rows and
    columns past M, N and K read as zeros). Then, per tile:

    GRAD = False: partials at ``part_ptr + i·part_plane + row·part_stride + pid_n`` for
    i = 0..3: the tile's max of c, Σ exp(c − max), c_y (0 when y is not in the tile) and Σ c
    (only with NEED_SUM).
    GRAD = True: d = row_scale · ∂L/∂x in d's dtype, row stride ``d_row_stride``.
    """
    num_m = tl.cdiv(M, TILE_M)
    num_n = tl.cdiv(N, TILE_N)
    for tile in tl.range(tl.program_id(0), num_m * num_n, num_programs, flatten=True):
        pid_m, pid_n = _tile_of(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((TILE_M, TILE_N), dtype=tl.float32)
        for k0 in range(0, K, TILE_K):
            a = h_desc.load([pid_m * TILE_M, k0])
            b = w_desc.load([pid_n * TILE_N, k0])
            acc = tl.dot(a, b.T, acc)

        rows = pid_m * TILE_M + tl.arange(0, TILE_M)
        cols = pid_n * TILE_N + tl.arange(0, TILE_N)
        row_ok = rows < M
        col_ok = cols < N
        local_target = tl.load(target_ptr + rows, mask=row_ok, other=-1) - col0
        hit = cols[None, :] == local_target[:, None]
        if HAS_BIAS:  # a 1-D load broadcast over the rows: a (1, TILE_N) one would make Triton move
            # the whole fp32 tile through shared memory to match its layout (past the SM's 227 KiB)
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        c = activate(acc, bias_ptr, cols, col_ok, softcap, False, HAS_SOFTCAP)
        if GRAD:
            lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
            scale = tl.load(row_scale_ptr + rows, mask=row_ok, other=0.0)
            grad = tl.exp(c - lse[:, None]) * (1.0 + 2.0 * z_loss * lse[:, None]) - label_smoothing * inv_vocab
            grad -= tl.where(hit, 1.0 - label_smoothing, 0.0)
            if HAS_SOFTCAP:
                t = c / softcap
                grad *= 1.0 - t * t
            grad *= scale[:, None]
            d_ptrs = d_ptr + rows.to(tl.int64)[:, None] * d_row_stride + cols[None, :]
            tl.store(d_ptrs, grad.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        else:
            c = tl.where(col_ok[None, :], c, float("-inf"))
            m = tl.max(c, axis=1)
            s = tl.sum(tl.exp(c - m[:, None]), axis=1)
            at = rows.to(tl.int64) * part_stride + pid_n
            plane = part_plane
            tl.store(part_ptr + at, m, mask=row_ok)
            tl.store(part_ptr + plane + at, s, mask=row_ok)
            tl.store(part_ptr + 2 * plane + at, tl.sum(tl.where(hit & col_ok[None, :], c, 0.0), axis=1), mask=row_ok)
            if NEED_SUM:
                tl.store(part_ptr + 3 * plane + at, tl.sum(tl.where(col_ok[None, :], c, 0.0), axis=1), mask=row_ok)


@triton.jit
def merge_tiles_kernel(part_ptr, part_stride, plane, n_tiles, max_ptr, sumexp_ptr, target_logit_ptr,
                       logit_sum_ptr, NEED_SUM: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: fold its ``n_tiles`` partials (planes ``plane`` elements apart), in
    tile order, into the running statistics (the online log-sum-exp merge of
    :class:`~fusedce.stats.RowStats`)."""
    row = tl.program_id(0).to(tl.int64)
    base = part_ptr + row * part_stride
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    z_target = tl.zeros((), tl.float32)
    z_sum = tl.zeros((), tl.float32)
    for start in range(0, n_tiles, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n_tiles
        pm = tl.load(base + offs, mask=ok, other=float("-inf"))
        ps = tl.load(base + plane + offs, mask=ok, other=0.0)
        m_new = tl.maximum(m, tl.max(pm, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.where(ok, ps * tl.exp(pm - m_new), 0.0), axis=0)
        m = m_new
        z_target += tl.sum(tl.load(base + 2 * plane + offs, mask=ok, other=0.0), axis=0)
        if NEED_SUM:
            z_sum += tl.sum(tl.load(base + 3 * plane + offs, mask=ok, other=0.0), axis=0)
    fold_into_row(max_ptr, sumexp_ptr, target_logit_ptr, logit_sum_ptr, row, m, s, z_target, z_sum, NEED_SUM)


def tiles_supported(h: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`tile_stats` / :func:`tile_grad` can multiply ``h (R, K) @ w (C, K)ᵀ``:
    a CUDA GPU with tensor-memory copies (compute capability ≥ 9.0), bf16/fp16 operands of one
    dtype, unit column stride and 16-byte-aligned rows (K a multiple of 8 elements)."""
    return (h.device.type == "cuda" and _has_tma(h.device.index)
            and _operands_fit(h, w))


def tiles_planned(hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype,
                  device: torch.device | None = None) -> bool:
    """Whether a loss over ``hidden (N, H)`` and ``weight (V, H)`` computed in ``compute_dtype``
    will run its blocks through the tiled kernels, so that its plan may size a block at 2 bytes
    a logit (:class:`fusedce.planner.ChunkPlan` ``tiled``): 2-byte operands laid out as
    :func:`tiles_supported` needs, on a GPU with tensor-memory copies. Hidden rows and weight rows in
    another dtype (an fp32 weight under autocast) are converted into contiguous buffers; rows of the
    compute dtype must have the layout themselves. A block the kernels still refuse runs
    through the block kernels in pieces of the buffer's fp32 size (:mod:`fusedce.passes`).
    ``device``: where the loss runs (default: the weight's; the memory model asks about the
    current GPU with meta tensors, which allocate nothing)."""
    device = weight.device if device is None else device
    return device.type == "cuda" and _has_tma(device.index) and _layout_planned(hidden, weight, compute_dtype)


def _layout_planned(hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """:func:`tiles_planned`'s dtype and layout conditions (any device), from dtypes, shapes and
    strides alone: Dynamo traces this under ``torch.compile`` (fake tensors: no address; neither
    ``data_ptr`` nor ``storage_offset`` can be traced), and a converted operand's buffer does not
    exist yet. An operand in another dtype will be a contiguous buffer of ``compute_dtype``, which
    fits when its rows hold a multiple of 8 elements (16 bytes); an operand of ``compute_dtype``
    needs unit column stride and a row stride of a multiple of 8. Its address is checked at the
    launch (:func:`tiles_supported`): a misaligned one runs through the block kernels in pieces of
    the buffer's fp32 size, correct and slower."""
    if (compute_dtype not in (torch.bfloat16, torch.float16) or hidden.dim() != 2 or weight.dim() != 2
            or hidden.shape[1] != weight.shape[1] or hidden.shape[1] % 8):
        return False
    return all(t.dtype != compute_dtype or (t.stride(1) == 1 and t.stride(0) % 8 == 0) for t in (hidden, weight))


def _operands_fit(h: torch.Tensor, w: torch.Tensor) -> bool:
    """The layout the tensor descriptors need (any device)."""
    return (h.dtype in (torch.bfloat16, torch.float16) and w.dtype == h.dtype
            and h.dim() == 2 and w.dim() == 2 and h.shape[1] == w.shape[1]
            and all(t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0 for t in (h, w)))


@functools.lru_cache(maxsize=None)
def _has_tma(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


@functools.lru_cache(maxsize=None)
def _programs(device: torch.device) -> int:
    """Persistent programs: one per SM (four in the interpreter)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def partial_bytes(rows: int, cols: int) -> int:
    """Bytes of :func:`tile_stats`'s partials for an (rows, cols) block."""
    return PARTIALS * rows * triton.cdiv(cols, TILE_N) * 4


_UNAVAILABLE: set[tuple] = set()  # kernel variants this GPU could not compile (e.g. out of shared memory)


def _launch(h: torch.Tensor, w: torch.Tensor, **kwargs) -> bool:
    """Launch the tile kernel; False (nothing written) where its variant cannot be compiled
    here, so the caller takes the block kernels instead."""
    variant = (h.device.type, h.dtype, *(kwargs[key] for key in ("GRAD", "HAS_BIAS", "HAS_SOFTCAP", "NEED_SUM")))
    if variant in _UNAVAILABLE:
        return False
    m, k = h.shape
    n = w.shape[0]
    h_desc = TensorDescriptor.from_tensor(h, [TILE_M, TILE_K])
    w_desc = TensorDescriptor.from_tensor(w, [TILE_N, TILE_K])
    tiles = triton.cdiv(m, TILE_M) * triton.cdiv(n, TILE_N)
    programs = min(tiles, _programs(h.device))
    try:
        logit_tiles_kernel[(programs,)](
            h_desc, w_desc, m, n, k, programs, **kwargs,
            TILE_M=TILE_M, TILE_N=TILE_N, TILE_K=TILE_K, GROUP_M=GROUP_M, num_stages=STAGES, num_warps=WARPS)
    except triton.runtime.errors.OutOfResources:  # raised while compiling, before the launch
        _UNAVAILABLE.add(variant)
        return False
    return True


def tile_stats(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, col0: int, target: torch.Tensor,
               stats: RowStats, scratch: torch.Tensor, *, softcap: float, need_sum: bool) -> bool:
    """:meth:`BlockMath.chunk_stats <fusedce.block_math.BlockMath.chunk_stats>` of the block
    ``x = h @ wᵀ``, without the block.

    h (R, K) and w (C, K): :func:`tiles_supported` operands; bias (C,) or None; target (R,)
    int64; stats: (R,) fp32 views, updated in place. ``scratch``: any fp32 tensor of at least
    :func:`partial_bytes` ``(R, C)`` bytes (its contents are overwritten). Returns False, with
    ``stats`` untouched, where this kernel variant cannot run on this GPU.
    """
    rows, cols = h.shape[0], w.shape[0]
    if rows == 0 or cols == 0:
        return True
    n_tiles = triton.cdiv(cols, TILE_N)
    assert scratch.dtype == torch.float32 and scratch.numel() * 4 >= partial_bytes(rows, cols)
    part = scratch.view(-1)[: PARTIALS * rows * n_tiles]
    launched = _launch(h, w, bias_ptr=bias if bias is not None else part, target_ptr=target, col0=col0,
            part_ptr=part, part_stride=n_tiles, part_plane=rows * n_tiles,
            lse_ptr=part, row_scale_ptr=part, d_ptr=part, d_row_stride=0, inv_vocab=0.0, label_smoothing=0.0,
            z_loss=0.0, softcap=float(softcap),
            GRAD=False, HAS_BIAS=bias is not None, HAS_SOFTCAP=bool(softcap), NEED_SUM=need_sum)
    if launched:
        merge_tiles_kernel[(rows,)](part, n_tiles, rows * n_tiles, n_tiles, stats.max, stats.sumexp,
                                    stats.target_logit, stats.logit_sum, NEED_SUM=need_sum, BLOCK=MERGE_BLOCK)
    return launched


def tile_grad(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, col0: int, target: torch.Tensor,
              lse: torch.Tensor, row_scale: torch.Tensor, out: torch.Tensor, *, vocab: int, label_smoothing: float,
              z_loss: float, softcap: float) -> torch.Tensor | None:
    """:meth:`BlockMath.logit_grad <fusedce.block_math.BlockMath.logit_grad>` of the block
    ``x = h @ wᵀ``, without the block: d (R, C) written into ``out`` (R, C) of h's dtype,
    unit column stride (any row stride), and returned; None, with nothing written, where this
    kernel variant cannot run on this GPU."""
    rows, cols = h.shape[0], w.shape[0]
    if rows == 0 or cols == 0:
        return out
    assert out.dtype == h.dtype and out.shape == (rows, cols) and out.stride(1) == 1
    launched = _launch(h, w, bias_ptr=bias if bias is not None else lse, target_ptr=target, col0=col0,
            part_ptr=lse, part_stride=0, part_plane=0,
            lse_ptr=lse, row_scale_ptr=row_scale, d_ptr=out, d_row_stride=out.stride(0), inv_vocab=1.0 / vocab,
            label_smoothing=float(label_smoothing), z_loss=float(z_loss), softcap=float(softcap),
            GRAD=True, HAS_BIAS=bias is not None, HAS_SOFTCAP=bool(softcap), NEED_SUM=False)
    return out if launched else None
