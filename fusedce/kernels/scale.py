"""Kernel: multiply a gradient in place by a 0-d fp32 factor, in fp32 (precompute's backward)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(grad_ptr, factor_ptr, numel, BLOCK: tl.constexpr):
    """One program per ``BLOCK`` elements: g = round(float(g) · factor). 64-bit offsets, so a
    V × H gradient beyond 2³¹ elements is fine. Each element is owned by one program."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    factor = tl.load(factor_ptr)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(grad_ptr + offs, (g * factor).to(grad_ptr.dtype.element_ty), mask=mask)


def scale_(grad: torch.Tensor, factor: torch.Tensor) -> None:
    """:meth:`BlockMath.scale_ <fusedce.block_math.BlockMath.scale_>` for a contiguous
    bf16/fp16/fp32 ``grad`` and an fp32 0-d ``factor`` (one launch, no temporary)."""
    numel = grad.numel()
    if numel == 0:
        return
    assert grad.is_contiguous() and factor.dtype == torch.float32 and factor.numel() == 1
    block = 4096
    scale_kernel[(triton.cdiv(numel, block),)](grad, factor, numel, BLOCK=block, num_warps=8)
