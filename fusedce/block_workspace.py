"""The buffers the recompute passes (:mod:`fusedce.passes`) reuse for every block of one pass."""
from __future__ import annotations

from typing import Callable

import torch

from fusedce.converter import Converter
from fusedce.matmul import matmul_into
from fusedce.planner import ChunkPlan, block_row_stride

WEIGHT_CHUNK_ALIGN = 256  # columns: the tiled kernels' tile width, so only the last chunk has a partial tile


def _weight_chunk_elements(cols: int, h: int, itemsize: int) -> int:
    """fp32 elements of the block buffer that a (cols, H) weight chunk of ``itemsize`` bytes takes,
    rounded up to 128 bytes (where the scratch after it starts)."""
    return -(-cols * h * itemsize // 128) * 32


class BlockWorkspace:
    """The buffers a pass reuses for every block, allocated in this order.

    ``block``: one (rows, cols) block of logits in the accumulation dtype, rows padded to
    :func:`block_row_stride`; half of that for a ``tiled`` plan, whose kernels store only a block's
    2-byte gradients (:meth:`narrow_block`; a block they refuse goes in pieces, :meth:`logit_pieces`).
    ``hidden_sum`` (backward): (rows, H) accumulation-dtype sum of a row chunk's grad_hidden over
    the vocabulary chunks. ``hidden_rows`` / ``weight_rows``:
    row chunks of hidden / vocabulary chunks of weight in the compute dtype. ``ones``
    (backward with a bias): (rows,) in the compute dtype, for grad_bias's column sums.

    An autocast forward may use the block buffer's bytes for a chunk of weight rows converted to
    the compute dtype instead, with its tile partials after it (:meth:`weight_chunk_view`): the
    tiled kernels need no fp32 logits, and the block's bytes hold more columns of weight than
    of logits (at H = 768 and 8192 rows, 1536 bytes a column against 32 KiB).
    """

    def __init__(self, plan: ChunkPlan, hidden: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype,
                 acc: torch.dtype, *, hidden_sum: bool = False, ones: bool = False) -> None:
        (n, h), v, device = hidden.shape, weight.shape[0], hidden.device
        rows = min(plan.rows, n)
        self._h, self._v = h, v
        self.block = torch.empty(plan.block_elements(rows, v, device), device=device, dtype=acc)
        self.hidden_sum = torch.empty(rows * h, device=device, dtype=acc) if hidden_sum else None
        self.hidden_rows = Converter(hidden, plan.rows, compute_dtype)
        self.weight_rows = Converter(weight, plan.cols, compute_dtype)
        self.ones = torch.ones(rows, device=device, dtype=compute_dtype) if ones else None

    def logits(self, h_i: torch.Tensor, w_j: torch.Tensor) -> torch.Tensor:
        """x = h_i @ w_jᵀ for h_i (R, H) and w_j (C, H) in the compute dtype: an (R, C) view of
        the block buffer in the accumulation dtype, unit column stride, padded row stride."""
        rows, cols = h_i.shape[0], w_j.shape[0]
        stride = block_row_stride(cols, self.block.device)
        z = self.block[: rows * stride].view(rows, stride)[:, :cols]
        matmul_into(z, h_i, w_j.t(), accumulate=False)
        return z

    @property
    def block_bytes(self) -> int:
        return self.block.numel() * self.block.element_size()

    def narrow_block(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """An (rows, cols) view of the block buffer in a 2-byte ``dtype``, rows padded to
        :func:`block_row_stride` (16-byte aligned for cuBLAS): where the tiled kernel writes a
        block's gradients without the fp32 logits (half the bytes an fp32 block takes)."""
        stride = block_row_stride(cols, self.block.device)
        return self.block.view(dtype)[: rows * stride].view(rows, stride)[:, :cols]

    def logit_pieces(self, rows: int, c0: int, c1: int) -> list[tuple[int, int]]:
        """Columns ``[c0, c1)`` of a block in pieces whose fp32 logits (:meth:`logits`) fit the
        block buffer: the whole block, except in a ``tiled`` plan's buffer (half an fp32 block),
        where a block the tiled kernels refuse goes in pieces of a multiple of 64 columns."""
        fits = self.block.numel() // max(rows, 1)  # elements of a row's share of the buffer
        if block_row_stride(c1 - c0, self.block.device) <= fits:
            return [(c0, c1)]
        pad = block_row_stride(1, self.block.device)  # a piece's padded rows fit too
        width = fits // pad * pad
        return [(s, min(c1, s + width)) for s in range(c0, c1, width)]

    def weight_chunk_cols(self, rows: int, h: int, itemsize: int, partial_bytes: Callable[[int, int], int]) -> int:
        """The widest chunk of weight rows (a multiple of :data:`WEIGHT_CHUNK_ALIGN` columns, or all V)
        that :meth:`weight_chunk_view` fits in the block buffer beside the ``partial_bytes(rows, cols)``
        of its tiles, for H = ``h`` and ``itemsize`` bytes of the compute dtype; 0 if none does."""
        v = self._v

        def fits(cols: int) -> bool:
            return _weight_chunk_elements(cols, h, itemsize) * 4 + partial_bytes(rows, cols) <= self.block_bytes

        if fits(v):
            return v
        step = WEIGHT_CHUNK_ALIGN
        cols = self.block_bytes // (h * itemsize + max(1, partial_bytes(rows, step) // step)) // step * step
        while cols > 0 and not fits(cols):
            cols -= step
        return min(cols, v)

    def weight_chunk_view(self, cols: int, h: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A (cols, H) ``dtype`` view of the block buffer's first bytes, where a chunk of weight rows
        is converted, and the rest of the buffer from the next 128-byte boundary, 1-D in the
        accumulation dtype (scratch for the chunk's tile partials)."""
        w = self.block.view(dtype)[: cols * h].view(cols, h)
        return w, self.block[_weight_chunk_elements(cols, h, w.element_size()):]

    def hidden_sum_rows(self, rows: int) -> torch.Tensor | None:
        """The first ``rows`` rows of ``hidden_sum`` as a (rows, H) view (None in forward)."""
        if self.hidden_sum is None:
            return None
        return self.hidden_sum[: rows * self._h].view(rows, self._h)
