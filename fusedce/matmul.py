"""Matrix products with an fp32 (or fp64) result from low-precision operands.

On CUDA, cuBLAS multiplies bf16/fp16 operands, accumulates in fp32 and can write (or add
into) an fp32 matrix directly (``torch.mm``/``torch.addmm`` with ``out_dtype``), so no fp32
copy of an operand and no temporary result is needed. Where that is not available (the
CPU build, older torch), the product is computed in the operands' dtype, as eager autocast
does, and added: one temporary of the result's size in the low-precision dtype (widening the
operands instead would cost a full-precision copy of a weight chunk). The addition goes a
slice of rows at a time, because adding a bf16 tensor into an fp32 one widens the whole
addend first (on the CPU, a 93 MiB fp32 copy of a 30464 × 768 weight-gradient chunk).
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

ADD_SLICE_BYTES = 4 << 20  # bytes of the widened addend per slice (CPU fallback)


@functools.lru_cache(maxsize=None)
def has_out_dtype(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm``/``torch.addmm`` take ``out_dtype`` for ``dtype`` operands on
    ``device_type``: a product written (or added) directly into an fp32 matrix."""
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


def matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool,
                align: bool | None = None) -> None:
    """``out (+)= a @ b``; a (M, K) and b (K, N) share a dtype, out (M, N) may be wider.

    The product is accumulated in at least fp32 whatever the operand dtype. On CUDA a ragged
    N or K (not a multiple of 8: V = 32777, or the last vocabulary chunk) is split into an
    aligned product plus a thin one for the last few columns, because cuBLAS runs a product
    with such a dimension far below its full rate (on an H200, (8192 × 768) @ (768 × 1161) at
    ~70 TFLOP/s, and (8192 × 768) @ (768 × 1160) at full rate). ``align`` forces the split on
    or off (default: on for CUDA tensors).
    """
    k, n = a.shape[1], b.shape[1]
    if align is None:
        align = out.device.type == "cuda"
    if align and n > ALIGN and n % ALIGN:
        cut = n - n % ALIGN
        matmul_into(out[:, :cut], a, b[:, :cut], accumulate=accumulate, align=True)  # K may be ragged too
        _product(out[:, cut:], a, b[:, cut:], accumulate)
    elif align and k > ALIGN and k % ALIGN:
        cut = k - k % ALIGN
        _product(out, a[:, :cut], b[:cut], accumulate)
        _product(out, a[:, cut:], b[cut:], True)
    else:
        _product(out, a, b, accumulate)


REDUCED_PRECISION_FLAGS = {torch.bfloat16: "allow_bf16_reduced_precision_reduction",
                           torch.float16: "allow_fp16_reduced_precision_reduction"}
"""PyTorch's switches (``torch.backends.cuda.matmul``, on by default) that let cuBLAS sum a product's
split-K partials in the 2-byte output dtype: each partial sum rounded, where one rounding of an fp32
sum was meant. Measured on an H100 (``benchmarks/results/grad-weight-rounding-h100-2026-12-06/``): a bf16
grad_weight chunk (C × 8192) @ (8192 × 768) written as bf16 had a relative error of 0.00174 at C = 4864 and
0.00190 at C = 27136 with the switch on, 0.00166 (one rounding) with it off, at the same step time."""


_SWITCHED = threading.Lock()
_inside = 0  # products inside one_rounding now, over every thread
_saved: dict[str, object] = {}  # the switches as they were when the first of them entered


@contextlib.contextmanager
def one_rounding(out: torch.Tensor):
    """While a product writes the 2-byte ``out`` on CUDA: its reduction in fp32, rounded once into ``out``.
    The switches (:data:`REDUCED_PRECISION_FLAGS`) are the process's: they are turned off when the first
    such product of any thread enters and restored when the last one leaves (a thread that restored them
    while another was inside would let that one's product round per partial). A product another thread
    launches meanwhile is summed in fp32 too — more exact, never less."""
    global _inside
    if out.device.type != "cuda" or out.dtype not in REDUCED_PRECISION_FLAGS:
        yield
        return
    with _SWITCHED:
        if _inside == 0:
            for name in REDUCED_PRECISION_FLAGS.values():
                _saved[name] = getattr(torch.backends.cuda.matmul, name)
                setattr(torch.backends.cuda.matmul, name, False)
        _inside += 1
    try:
        yield
    finally:
        with _SWITCHED:
            _inside -= 1
            if _inside == 0:
                for name, before in _saved.items():
                    setattr(torch.backends.cuda.matmul, name, before)


def _product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    if out.dtype == a.dtype:
        with one_rounding(out):
            if accumulate:
                torch.addmm(out, a, b, out=out)
            else:
                torch.mm(a, b, out=out)
    elif has_out_dtype(a.device.type, a.dtype):
        if accumulate:
            torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
        else:
            torch.mm(a, b, out_dtype=out.dtype, out=out)
    elif accumulate:
        _add_by_rows(out, torch.mm(a, b))
    else:
        out.copy_(torch.mm(a, b))


def add_slice_rows(cols: int, itemsize: int) -> int:
    """Rows per slice of :func:`_add_by_rows` for an addend ``cols`` wide, widened to ``itemsize`` bytes."""
    return max(1, ADD_SLICE_BYTES // max(1, cols * itemsize))


def _add_by_rows(out: torch.Tensor, addend: torch.Tensor) -> None:
    """``out += addend`` (addend narrower than out), widening at most one slice of rows at a time."""
    step = add_slice_rows(out.shape[1], out.element_size())
    for r0 in range(0, out.shape[0], step):
        out[r0: r0 + step].add_(addend[r0: r0 + step])


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


def split_k_sm_count(device: torch.device, dtype: torch.dtype) -> int | None:
    """The SM count of ``device`` when split-K products (:func:`split_k_matmul_into`) are
    available for ``dtype`` operands there — CUDA with a batched product that writes fp32
    (``torch.bmm(..., out_dtype=torch.float32)``) — else None (the planner never splits)."""
    if device.type != "cuda" or not _has_bmm_out_dtype(device.type, dtype):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_k_matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, partials: torch.Tensor | None) -> None:
    """``out = a @ b`` (out (M, N) fp32, a (M, K), b (K, N) in one low-precision dtype), K
    split over ``partials.shape[0]`` slices multiplied side by side (see
    :func:`fusedce.precompute_plan.split_k_count`), then summed in a fixed order (deterministic).

    ``partials``: an fp32 buffer of at least (S, M, N) elements, or None for one product.
    Slices start at multiples of 64 elements; the K % S leftover is one more thin product.
    """
    if partials is None or partials.shape[0] == 1:
        matmul_into(out, a, b, accumulate=False)
        return
    splits = partials.shape[0]
    m, k = a.shape
    n = b.shape[1]
    step = k // splits // 64 * 64
    if step == 0:
        matmul_into(out, a, b, accumulate=False)
        return
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
