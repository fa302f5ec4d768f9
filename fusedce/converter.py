"""Chunks of a matrix in the compute dtype, converted into one reused buffer."""
from __future__ import annotations

import torch


class Converter:
    """Rows ``[r0, r1)`` of a (M, K) matrix in the compute dtype.

    A view when the dtype already matches; otherwise a copy into one buffer of
    ``max_rows × K`` reused for every chunk, so two converted chunks never coexist.
    """

    def __init__(self, matrix: torch.Tensor, max_rows: int, dtype: torch.dtype) -> None:
        self.matrix, self.dtype = matrix, dtype
        self.buffer = None
        if matrix.dtype != dtype:
            rows = min(max_rows, matrix.shape[0])
            self.buffer = torch.empty(rows * matrix.shape[1], device=matrix.device, dtype=dtype)

    def __call__(self, r0: int, r1: int) -> torch.Tensor:
        if self.buffer is None:
            return self.matrix[r0:r1]
        out = self.buffer[: (r1 - r0) * self.matrix.shape[1]].view(r1 - r0, self.matrix.shape[1])
        return out.copy_(self.matrix[r0:r1])
