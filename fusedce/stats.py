"""Per-token running statistics of the logits, accumulated over vocabulary chunks."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowStats:
    """Running statistics of each token's (soft-capped, biased) logits row, all ``(N,)``.

    ``max`` and ``sumexp`` form an online log-sum-exp: ``lse = max + log(sumexp)``, where
    ``sumexp = Σ_v exp(z_v − max)``. Merging two partial results (m₁, s₁), (m₂, s₂):
    ``m = max(m₁, m₂)``, ``s = s₁·exp(m₁ − m) + s₂·exp(m₂ − m)``.
    ``target_logit`` is ``z_y`` (0 for ignored tokens); ``logit_sum`` is ``Σ_v z_v`` (only
    filled when label smoothing needs it).
    """

    max: torch.Tensor
    sumexp: torch.Tensor
    target_logit: torch.Tensor
    logit_sum: torch.Tensor

    @classmethod
    def empty(cls, n: int, device: torch.device, dtype: torch.dtype) -> "RowStats":
        return cls(
            max=torch.full((n,), float("-inf"), device=device, dtype=dtype),
            sumexp=torch.zeros(n, device=device, dtype=dtype),
            target_logit=torch.zeros(n, device=device, dtype=dtype),
            logit_sum=torch.zeros(n, device=device, dtype=dtype),
        )

    def rows(self, start: int, stop: int) -> "RowStats":
        return RowStats(self.max[start:stop], self.sumexp[start:stop],
                        self.target_logit[start:stop], self.logit_sum[start:stop])

    def logsumexp(self) -> torch.Tensor:
        return self.max + torch.log(self.sumexp)
