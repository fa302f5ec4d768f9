"""Kernel: the gradient of each token's loss with respect to its raw logits, in place."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusedce.kernels.activation import activate


@triton.jit
def logit_grad_kernel(
    z_ptr, z_row_stride, d_ptr, d_row_stride, bias_ptr, target_ptr, lse_ptr, row_scale_ptr,
    col0, n_cols, inv_vocab, label_smoothing, z_loss, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IN_PLACE_NARROW: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per token row: d = row_scale · ∂L/∂x for the block's raw logits x.

    The formula is :mod:`fusedce.block_math`'s, evaluated in fp32 ``BLOCK_V`` columns at a
    time (``p_coef`` = 1 + 2λ·lse, ``inv_vocab`` = 1/V).

    ``d`` may alias ``z`` as a narrower dtype (``IN_PLACE_NARROW``: a bf16/fp16 view of the
    same bytes, whose row stride is twice z's in elements, so row n of d starts where row n
    of z does): the store of columns [k·B, (k+1)·B) writes bytes that the loads of those
    columns, and of columns < (k+1)·B/2, read. The barrier after each iteration's loads
    keeps warps that run ahead from overwriting logits that other warps have not loaded
    yet. The race never shows in the interpreter (it runs a program as one thread):
    ``tests/test_fusedce_block_math.py`` checks that the barrier stays in the source.
    """
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_row_stride
    d_row = d_ptr + row * d_row_stride
    local_target = tl.load(target_ptr + row) - col0
    lse = tl.load(lse_ptr + row)
    scale = tl.load(row_scale_ptr + row)
    p_coef = 1.0 + 2.0 * z_loss * lse
    for start in range(0, n_cols, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < n_cols
        x = tl.load(z_row + offs, mask=mask, other=0.0).to(tl.float32)
        if IN_PLACE_NARROW:
            tl.debug_barrier()
        c = activate(x, bias_ptr, offs, mask, softcap, HAS_BIAS, HAS_SOFTCAP)
        grad = tl.exp(c - lse) * p_coef - label_smoothing * inv_vocab
        grad -= tl.where(offs == local_target, 1.0 - label_smoothing, 0.0)
        if HAS_SOFTCAP:
            t = c / softcap
            grad *= 1.0 - t * t
        grad *= scale
        tl.store(d_row + offs, grad.to(d_ptr.dtype.element_ty), mask=mask)


def logit_grad(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    col0: int,
    target: torch.Tensor,
    lse: torch.Tensor,
    row_scale: torch.Tensor,
    *,
    vocab: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:meth:`BlockMath.logit_grad <fusedce.block_math.BlockMath.logit_grad>`.

    Without ``out``, ``z`` is fp32 and the result is ``z`` itself for fp32 ``out_dtype``; for a
    2-byte one, a view of z's own memory: (R, C) with twice z's row stride, which cuBLAS reads
    directly. No new R×C buffer is allocated. With ``out`` ((R, C) of ``out_dtype``, unit column
    stride, not overlapping ``z``), ``z`` may be fp32, bf16 or fp16 and is left unchanged.
    """
    rows, n_cols = z.shape
    assert z.stride(1) == 1 and (z.dtype == torch.float32 or out is not None)
    if out is not None:
        assert out.dtype == out_dtype and out.shape == z.shape and out.stride(1) == 1
        d = out
    elif out_dtype == torch.float32:
        d = z
    elif out_dtype in (torch.bfloat16, torch.float16):
        d = z.view(out_dtype)[:, :n_cols]
    else:
        raise TypeError(f"impl='triton' computes in float32/bfloat16/float16, not {out_dtype}")
    if rows == 0:
        return d
    block = min(triton.next_power_of_2(n_cols), 2048)
    logit_grad_kernel[(rows,)](
        z, z.stride(0), d, d.stride(0), bias if bias is not None else z, target, lse, row_scale,
        col0, n_cols, 1.0 / vocab, float(label_smoothing), float(z_loss), float(softcap),
        HAS_BIAS=bias is not None, HAS_SOFTCAP=bool(softcap), IN_PLACE_NARROW=out is None and d.dtype != z.dtype,
        BLOCK_V=block, num_warps=8 if block >= 2048 else 4,
    )
    return d
