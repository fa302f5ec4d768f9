"""Synthetic but learnable training data: token sequences from a fixed random Markov chain.

Each token has ``branching`` possible successors with fixed random probabilities, so a
model that learns the transitions can push the loss from ln V (uniform guessing) down to
the chain's entropy rate (:meth:`MarkovChain.entropy_rate`), which is the floor any
correct training run approaches. Successors are drawn with Zipf-like frequencies
(p ∝ 1/rank, as words in text), so the chain concentrates on frequent tokens and even a
short run with a 32k-token vocabulary learns visibly (a uniform choice over V = 32777
barely moves the loss in a few hundred steps). Batches are a pure function of (seed, step): every
back-end trains on exactly the same tokens.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from fusedce.options import IGNORE_INDEX


@dataclass(frozen=True)
class MarkovChain:
    """A random first-order chain over ``vocab`` tokens (built on the CPU, deterministic)."""

    vocab: int
    branching: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 2:
            raise ValueError(f"vocab must be at least 2, got {self.vocab}")
        if not 1 <= self.branching <= self.vocab:
            raise ValueError(f"branching must be in [1, vocab={self.vocab}], got {self.branching}")

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(successors: (V, k) int64, probabilities: (V, k) fp32, rows sum to 1)."""
        return _chain_tables(self.vocab, self.branching, self.seed)

    def entropy_rate(self, iterations: int = 200) -> float:
        """Σ_i π_i H(P_i) in nats, with π the stationary distribution (power iteration)."""
        successors, probs = self.tables()
        pi = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        p64 = probs.double()
        for _ in range(iterations):
            pi = torch.zeros_like(pi).index_add_(0, successors.reshape(-1), (pi[:, None] * p64).reshape(-1))
        row_entropy = -(p64 * p64.log()).sum(-1)
        return float((pi * row_entropy).sum())

    def batch(self, step: int, batch: int, seq: int, ignore_frac: float = 0.0, seed: int = 0):
        """(input_ids, targets), each (B, T) int64, for training step ``step``.

        With ``ignore_frac`` > 0 each sequence ends in padding of random length (about
        ``ignore_frac`` of the targets on average): its targets are ``IGNORE_INDEX`` and its
        inputs token 0, as a padded batch would be.
        """
        if not 0.0 <= ignore_frac < 1.0:
            raise ValueError(f"ignore_frac must be in [0, 1), got {ignore_frac}")
        successors, probs = self.tables()
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + seed * 7_919 + step) % (1 << 62))
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch,), generator=gen)
        for t in range(seq):
            current = tokens[:, t]
            choice = torch.multinomial(probs[current], 1, generator=gen).squeeze(1)
            tokens[:, t + 1] = successors[current, choice]
        inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        if ignore_frac > 0:
            pad = torch.randint(0, max(1, math.ceil(2 * ignore_frac * seq)), (batch,), generator=gen)
            positions = torch.arange(seq)
            padded = positions[None, :] >= (seq - pad)[:, None]
            targets[padded] = IGNORE_INDEX
            inputs[padded] = 0
        return inputs, targets


@functools.lru_cache(maxsize=4)
def _chain_tables(vocab: int, branching: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float32)
    successors = torch.multinomial(zipf, vocab * branching, replacement=True, generator=gen).reshape(vocab, branching)
    weights = torch.rand(vocab, branching, generator=gen) + 0.1
    return successors, weights / weights.sum(-1, keepdim=True)


def random_batch(vocab: int, batch: int, seq: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random (input_ids, targets), each (B, T) int64; targets are the next tokens.

    The batch of a memory measurement: its values do not matter, its shapes do.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
