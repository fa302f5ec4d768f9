"""Matrix products with an fp32 (or fp64) result from low-precision operands.

On CUDA, cuBLAS multiplies bf16/fp16 operands, accumulates in fp32 and can write (or add
into) an fp32 matrix directly (``torch.mm``/``torch.addmm`` with ``out_dtype``), so no fp32
copy of an operand and no temporary result is needed. Where that is not available (the
CPU build, older torch), the product is computed in the operands' dtype, as eager autocast
does, and added: one temporary of the result's size in the low-precision dtype (widening the
operands instead would cost a full-precision copy of a weight chunk).
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _has_out_dtype(device_type: str, dtype: torch.dtype) -> bool:
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, device=device_type, dtype=dtype)
        out = torch.zeros(2, 2, device=device_type, dtype=torch.float32)
        torch.addmm(out, a, a, out_dtype=torch.float32, out=out)
        torch.mm(a, a, out_dtype=torch.float32, out=out)
        return True
    except (TypeError, RuntimeError):
        return False


ALIGN = 8  # elements: 16 bytes of bf16


def matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool) -> None:
    """``out (+)= a @ b``; a (M, K) and b (K, N) share a dtype, out (M, N) may be wider.

    The product is accumulated in at least fp32 whatever the operand dtype. On CUDA a ragged
    K or N (not a multiple of 8, e.g. V = 32777 or the last vocabulary chunk) is split into
    an aligned product and a thin one for the last few columns: measured on an H200, cuBLAS
    runs a (448 × 768) @ (768 × 32777) product at ~80 TFLOP/s but 32776 columns at full rate.
    """
    k, n = a.shape[1], b.shape[1]
    if out.device.type == "cuda" and n > ALIGN and n % ALIGN:
        cut = n - n % ALIGN
        _product(out[:, :cut], a, b[:, :cut], accumulate)
        _product(out[:, cut:], a, b[:, cut:], accumulate)
    elif out.device.type == "cuda" and k > ALIGN and k % ALIGN:
        cut = k - k % ALIGN
        _product(out, a[:, :cut], b[:cut], accumulate)
        _product(out, a[:, cut:], b[cut:], True)
    else:
        _product(out, a, b, accumulate)


def _product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    if out.dtype == a.dtype:
        if accumulate:
            torch.addmm(out, a, b, out=out)
        else:
            torch.mm(a, b, out=out)
    elif _has_out_dtype(a.device.type, a.dtype):
        if accumulate:
            torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
        else:
            torch.mm(a, b, out_dtype=out.dtype, out=out)
    elif accumulate:
        out.add_(torch.mm(a, b))
    else:
        out.copy_(torch.mm(a, b))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _has_bmm_out_dtype(device_type: str, dtype: torch.dtype) -> bool:
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, 2, device=device_type, dtype=dtype)
        torch.bmm(a, a, out_dtype=torch.float32, out=torch.empty(2, 2, 2, device=device_type))
        return True
    except (TypeError, RuntimeError):
        return False


def split_k_count(m: int, n: int, k: int, device: torch.device, dtype: torch.dtype) -> int:
    """How many slices of K to run side by side for an (M, K) @ (K, N) product.

    A GEMM with a small output (M·N) and a long K — grad_hidden = d @ W for a few hundred
    tokens, K = V — has only ``⌈M/128⌉·⌈N/128⌉`` output tiles, e.g. 4·6 = 24 for 448 × 768,
    and leaves most of the GPU's SMs idle. Cutting K into S slices, multiplied as one batched
    GEMM into S fp32 partial products and then summed, gives S times as many tiles. Returns 1
    (no split) off CUDA, when the output already fills the GPU, or when K is short.
    """
    if device.type != "cuda" or not _has_bmm_out_dtype(device.type, dtype):
        return 1
    tiles = -(-m // 128) * -(-n // 128)
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    splits = min(16, max(1, (2 * sms) // max(tiles, 1)), k // 1024)
    return max(1, splits)


def split_k_matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, partials: torch.Tensor | None) -> None:
    """``out = a @ b`` (out fp32 (M, N), a (M, K), b (K, N) in one low-precision dtype),
    split over ``partials.shape[0]`` slices of K (see :func:`split_k_count`).

    ``partials`` is an fp32 buffer of at least (S, M, N) elements, or None for no split.
    The K % S leftover columns are added by one more (thin) GEMM.
    """
    if partials is None or partials.shape[0] == 1:
        matmul_into(out, a, b, accumulate=False)
        return
    splits = partials.shape[0]
    m, k = a.shape
    n = b.shape[1]
    step = k // splits // 64 * 64  # slices start 128-byte aligned (cuBLAS's fast paths need 16)
    main = step * splits
    part = partials.view(-1)[: splits * m * n].view(splits, m, n)
    slices_a = a[:, :main].unflatten(1, (splits, step)).transpose(0, 1)  # (S, M, step)
    slices_b = b[:main].unflatten(0, (splits, step))                     # (S, step, N)
    if a.dtype == part.dtype:
        torch.bmm(slices_a, slices_b, out=part)
    else:
        torch.bmm(slices_a, slices_b, out_dtype=part.dtype, out=part)
    torch.sum(part, dim=0, out=out)
    if main < k:
        matmul_into(out, a[:, main:], b[main:], accumulate=True)
