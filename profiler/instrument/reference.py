"""The fp32 reference loss and gradients, computed in chunks of tokens, and parity.

The reference upcasts the cell's own inputs to fp32 and evaluates :func:`torch_loss`
(the eager formula: bias, ignore_index, label smoothing, z-loss, soft-cap) on ``chunk``
rows at a time, so it never holds more than chunk × V fp32 logits: it fits wherever the
inputs and fp32 gradients fit, even where a naive back-end ran out of memory. It runs in
true fp32 (TF32 and autocast off, whatever the caller set). "mean" is normalised by the
number of non-ignored rows of the whole batch, not of each chunk.

Both the profiler (:mod:`fusedce_profiler.grid.cell`) and the benchmark (``benchmarks/``) use it.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import torch_loss
from fusedce_profiler.instrument.records import Parity

#: Target bytes of one chunk's fp32 logits (chunk rows × V × 4).
CHUNK_LOGIT_BYTES = 512 * 2**20


@dataclass
class Reference:
    """fp32 loss (scalar, or (N,) for reduction="none") and gradients."""

    loss: torch.Tensor
    grad_hidden: torch.Tensor
    grad_weight: torch.Tensor
    grad_bias: torch.Tensor | None

    def to(self, device) -> "Reference":
        return Reference(*(t.to(device) if t is not None else None
                           for t in (self.loss, self.grad_hidden, self.grad_weight, self.grad_bias)))

    def to_host(self) -> "Reference":
        """A copy in host memory, page-locked where it comes from a GPU: the copy out and each
        back-end's comparison against it (:func:`relative_error`) then run at the bus's speed,
        without faulting in fresh pages (3 GiB of gradients at 64k × 4096 × 128256: about 1.5 s
        a size through pageable memory). Where page-locked memory cannot be had, pageable."""
        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.device.type == "cpu":
                return t
            try:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            except RuntimeError:  # no page-locked memory to be had
                return t.cpu()
            return host.copy_(t)

        return Reference(*(copy(t) for t in (self.loss, self.grad_hidden, self.grad_weight, self.grad_bias)))


@contextlib.contextmanager
def _true_fp32(device_type: str):
    """TF32 and autocast off for the duration; the caller's TF32 flags are restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.autocast(device_type, enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def reference(hidden, weight, target, bias, options: LossOptions, *, chunk: int | None = None) -> Reference:
    """fp32 loss and gradients of ``torch_loss`` on the given inputs (which are not modified).

    hidden (N, H), weight (V, H), target (N,) int64, bias (V,) or None, in any float dtype.
    ``chunk`` rows per step (default: as many as fit in :data:`CHUNK_LOGIT_BYTES`). Raises
    ``ValueError`` for a non-positive ``chunk``, and for reduction "mean" when every target
    is ignored (the mean is 0/0).
    """
    if chunk is not None and chunk <= 0:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk!r}")
    n, v = hidden.shape[0], weight.shape[0]
    chunk = chunk or max(1, CHUNK_LOGIT_BYTES // (4 * v))
    w = weight.detach().float().requires_grad_()
    b = bias.detach().float().requires_grad_() if bias is not None else None
    valid = int((target != options.ignore_index).sum())
    if options.reduction == "mean" and not valid:
        raise ValueError(f"every target is ignore_index={options.ignore_index}: the mean loss is 0/0")
    per_chunk = LossOptions(options.ignore_index, "none" if options.reduction == "none" else "sum",
                            options.label_smoothing, options.z_loss, options.softcap)
    scale = 1.0 / valid if options.reduction == "mean" else 1.0
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
    pieces = []
    with _true_fp32(hidden.device.type):
        for start in range(0, n, chunk):
            h = hidden[start:start + chunk].detach().float().requires_grad_()
            loss = torch_loss(h, w, target[start:start + chunk], b, per_chunk) * scale
            # d(total)/d(piece) is 1 for sum/mean (scale folded in) and 1 per row for "none".
            loss.backward(torch.ones_like(loss))
            grad_hidden[start:start + chunk] = h.grad
            pieces.append(loss.detach())
    total = torch.cat(pieces) if options.reduction == "none" else torch.stack(pieces).sum()
    return Reference(total, grad_hidden, w.grad, b.grad if b is not None else None)


COMPARE_CHUNK = 1 << 24
"""Elements per chunk of a relative error's sums on a GPU (bounded temporaries, few launches)."""

COMPARE_CHUNK_CPU = 1 << 15
"""Elements per chunk on the CPU: at most ATen's grain size (32768), so each chunk's ops run
inline on the calling thread rather than as a parallel region, and the two fp64 buffers
(256 KiB each) stay in cache. With the 2²⁴-element chunks of a GPU, every chunk allocated
four 128 MiB fp64 temporaries, and on a two-core machine shared with other work each
parallel region waited for a descheduled thread: 0.5 s of CPU per 25 M-element gradient,
against 0.05 s this way."""


def relative_error(got: torch.Tensor | None, ref: torch.Tensor | None) -> float | None:
    """‖got − ref‖ / ‖ref‖ — the one definition of a relative error in this project.

    Sums of squares in fp64, a chunk at a time on ``got``'s device (``ref`` may live
    elsewhere, e.g. on the CPU): :data:`COMPARE_CHUNK` elements on a GPU,
    :data:`COMPARE_CHUNK_CPU` on the CPU, widened into two reused fp64 buffers. ``None`` if
    either is missing; NaN if ``got`` is not finite; when ``ref`` is zero, 0 for an exact zero
    and infinity otherwise.
    """
    if got is None or ref is None:
        return None
    if got.numel() != ref.numel():
        raise ValueError(f"value has shape {tuple(got.shape)}, reference {tuple(ref.shape)}")
    device = got.device
    chunk = COMPARE_CHUNK_CPU if device.type == "cpu" else COMPARE_CHUNK
    size = min(chunk, got.numel())
    diff_buffer = torch.empty(size, dtype=torch.float64, device=device)
    ref_buffer = torch.empty(size, dtype=torch.float64, device=device)
    # A reference on another device crosses in its own dtype, then widens here: a blocking
    # copy between devices that also converts does the conversion on the CPU, into a fresh
    # fp64 host tensor per chunk (128 MiB at 2²⁴ elements: 32 k page faults and a zero fill).
    staging = None if ref.device == device else torch.empty(size, dtype=ref.dtype, device=device)
    diff = torch.zeros((), dtype=torch.float64, device=device)
    norm = torch.zeros((), dtype=torch.float64, device=device)
    for g, r in zip(got.detach().reshape(-1).split(chunk), ref.detach().reshape(-1).split(chunk)):
        d, r64 = diff_buffer[: g.numel()], ref_buffer[: g.numel()]
        if staging is not None:
            r = staging[: r.numel()].copy_(r)
        r64.copy_(r)
        d.copy_(g).sub_(r64)
        diff += d.square_().sum()
        norm += r64.square_().sum()
    diff, norm = diff.item(), norm.item()
    if not math.isfinite(diff):  # an infinite element as much as a NaN: not a value to compare
        return math.nan
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return math.sqrt(diff / norm)


def parity(loss, grad_hidden, grad_weight, grad_bias, ref: Reference) -> Parity:
    """Relative errors of a back-end's loss and gradients against the reference."""
    return Parity(loss=relative_error(loss, ref.loss), grad_hidden=relative_error(grad_hidden, ref.grad_hidden),
                  grad_weight=relative_error(grad_weight, ref.grad_weight),
                  grad_bias=relative_error(grad_bias, ref.grad_bias))
