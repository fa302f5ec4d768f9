"""The softmax math on one block of logits: the contract both implementations keep.

The passes (:mod:`fusedce.passes`) cut the N×V logits into ``R × C`` blocks and, for each,
compute the raw logits ``x = hidden[r0:r1] @ weight[col0:col0 + C].T`` into a block of the
accumulation dtype. What happens to a block next is a :class:`BlockMath`:
:mod:`fusedce.block_math_torch` (PyTorch ops, any device) or :mod:`fusedce.kernels`
(Triton kernels: CUDA, or CPU under ``TRITON_INTERPRET=1``). The passes pass the module
itself; a module whose functions have these signatures is a ``BlockMath``.

The math. Per token n with target y, label smoothing ε, z-loss weight λ and soft-cap s:

    c   = s·tanh((x + b)/s)              (c = x + b without soft-capping; b the bias, or 0)
    lse = log Σ_v exp(c_v)
    L   = (1 − ε)(lse − c_y) + ε(lse − Σ_v c_v / V) + λ·lse²

so, with p = softmax(c) = exp(c − lse),

    ∂L/∂c_v = p_v·(1 + 2λ·lse) − (1 − ε)·[v = y] − ε/V
    ∂c_v/∂x_v = 1 − tanh² = 1 − (c_v/s)²    (1 without soft-capping)

``lse`` is accumulated over vocabulary chunks online (:class:`fusedce.stats.RowStats`):
a block's maximum m_b and Σ_b exp(c − m_b) are merged into the running (max, sumexp) as
``m = max(m₁, m₂)``, ``s = s₁·exp(m₁ − m) + s₂·exp(m₂ − m)``, so no row is ever whole.

Shared conventions of both methods:

- ``z``: (R, C) raw logits ``x`` of vocabulary columns ``[col0, col0 + C)``, in the
  accumulation dtype (fp32; fp64 for fp64 inputs, PyTorch implementation only), or in a
  2-byte compute dtype for logits kept from the forward (:mod:`fusedce.kept_plan`). Unit
  column stride; the row stride may be padded beyond C. ``R == 0`` is allowed.
- ``bias``: ``bias[col0:col0 + C]`` (C,), contiguous, any floating dtype (added in the
  accumulation dtype), or ``None``.
- ``target``: (R,) int64, contiguous. Any value: a target outside ``[col0, col0 + C)``
  (another chunk's, ``ignore_index``, out of range) simply never matches a column.
- ``softcap``: ``s``, or 0.0 for no soft-capping (:attr:`fusedce.options.LossOptions.softcap_value`).
- ``chunk_stats`` leaves ``z`` unchanged (the precompute strategy turns the same block into
  gradients next); ``logit_grad`` overwrites it.
- Block-sized temporaries, if any, are the implementation's to document: the memory
  model (:mod:`fusedce.memory_model`) counts them.

An implementation may also be a :class:`TileMath`: kernels that multiply a block's operands
and apply the same math to each output tile in registers, so the fp32 block is never
written (:mod:`fusedce.kernels.tiles`). The passes use them where ``tiles_supported`` says so,
with the same block buffer as scratch: the memory of a step does not change.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from fusedce.stats import RowStats


class BlockMath(Protocol):
    """The per-block softmax math of the passes (see the module docstring for the math)."""

    def chunk_stats(
        self,
        z: torch.Tensor,
        bias: torch.Tensor | None,
        col0: int,
        target: torch.Tensor,
        stats: RowStats,
        *,
        softcap: float,
        need_sum: bool,
    ) -> None:
        """Fold the block into each token's running statistics (forward).

        ``stats``: (R,) views of the accumulation dtype, updated in place: (``max``,
        ``sumexp``) merged with the block's online log-sum-exp of c; ``target_logit`` +=
        c_y where y is in the block; ``logit_sum`` += Σ_v c_v over the block, only when
        ``need_sum`` (label smoothing), else left untouched.
        """
        ...

    def logit_grad(
        self,
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
        """The logit gradients of the block: d[n, v] = row_scale[n] · ∂L_n/∂x_nv (backward).

        ``lse``: (R,) the tokens' log-sum-exp from forward; ``row_scale``: (R,) per-token
        factor (the upstream gradient; 0 for ignored tokens, NaN for out-of-range targets);
        both in the accumulation dtype. ``vocab``: V, the whole vocabulary (for ε/V);
        ``label_smoothing`` ε, ``z_loss`` λ.

        Returns d, (R, C) in ``out_dtype`` (the compute dtype), overwriting ``z``. The
        result may share ``z``'s memory (``z`` itself, or a narrower view of its bytes),
        so it is valid until the block's buffer is written again. With ``out`` ((R, C) of
        ``out_dtype``, unit column stride, apart from ``z``), d is written there and returned,
        and ``z`` (then fp32 or 2-byte) is left unchanged: the kept logits of a second backward.
        """
        ...

    def scale_(self, grad: torch.Tensor, factor: torch.Tensor) -> None:
        """In place: ``grad *= factor`` (the precompute strategy's upstream gradient).

        ``grad``: any shape, contiguous, bf16/fp16/fp32 (fp64 in PyTorch); ``factor``: a 0-d
        tensor in the accumulation dtype on ``grad``'s device. The product is taken in
        ``factor``'s dtype and rounded once to ``grad``'s, so the factor is never rounded to
        bf16 first (a factor of 1 or a power of two leaves ``grad`` bitwise unchanged).
        """
        ...


@runtime_checkable
class TileMath(Protocol):
    """The block math fused with the block's product ``x = h @ wᵀ`` (h (R, K), w (C, K), both in
    the compute dtype): the same results as :class:`BlockMath`'s ``chunk_stats`` and
    ``logit_grad`` on that product, from the operands instead of an fp32 block."""

    def tiles_supported(self, h: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether these operands (device, dtype, layout) can go through the tiled kernels."""
        ...

    def partial_bytes(self, rows: int, cols: int) -> int:
        """Bytes of scratch ``tile_stats`` needs for an (rows, cols) block."""
        ...

    def tile_stats(self, h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, col0: int,
                   target: torch.Tensor, stats: RowStats, scratch: torch.Tensor, *, softcap: float,
                   need_sum: bool) -> None:
        """``chunk_stats`` of ``h @ wᵀ``; ``scratch``: fp32, at least ``partial_bytes(R, C)`` bytes."""
        ...

    def tile_grad(self, h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, col0: int,
                  target: torch.Tensor, lse: torch.Tensor, row_scale: torch.Tensor, out: torch.Tensor, *,
                  vocab: int, label_smoothing: float, z_loss: float, softcap: float) -> torch.Tensor:
        """``logit_grad`` of ``h @ wᵀ`` written into ``out`` (R, C) of the compute dtype, returned."""
        ...
