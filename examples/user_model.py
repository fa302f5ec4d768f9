"""A model of your own for ``fusedce-profile model --model examples.user_model:build``.

The contract (``profiler/models/source.py``):

- ``build`` is any callable returning an ``nn.Module``; if it takes an argument it receives
  the parsed ``ModelConfig`` of ``--preset``/``--config`` (V, H, layers, heads), else it is
  called without one.
- ``model(input_ids)`` with ``input_ids`` (B, T) int64 returns the logits (B, T, V): a
  tensor, an object with ``.logits``, or a tuple whose first item is them.
- The LM head is found automatically (``get_output_embeddings()``, else the last
  ``nn.Linear`` with ``out_features`` = V), or named with ``--head attr.path``. The fused
  back-ends read the head's *input* through a forward pre-hook on that module, so ``forward``
  may have any signature and any code around the head.

This file reproduces the original report's model: a GPT whose head is wrapped in another
module, with the tie assigned on the wrapper (``self.head.weight = self.embed.weight``)
while the wrapper's forward calls its inner ``Linear`` — which keeps its own weight. The
report says which parameter the head's forward really uses (``head.proj.weight``: untied).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class HeadWrapper(nn.Module):
    """The LM head inside a wrapper (as Lightning modules often hold it)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 3 * hidden), nn.GELU(), nn.Linear(3 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class UserGPT(nn.Module):
    def __init__(self, vocab: int = 512, hidden: int = 64, layers: int = 2, heads: int = 4, max_len: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = HeadWrapper(hidden, vocab)
        self.head.weight = self.embed.weight  # the intended tie: forward never uses it

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.embed(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(config=None) -> UserGPT:
    """The model; with ``--preset``/``--config`` its shapes come from that config."""
    if config is None:
        return UserGPT()
    return UserGPT(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.max_position_embeddings)


def wrapper_that_materialises(hidden, weight, target, bias=None, **options):
    """A loss wrapper with the bug the detector exists for: it calls a cross-entropy on
    materialised logits instead of a fused linear-cross-entropy (``--backend
    examples.user_model:wrapper_that_materialises``)."""
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.float(), target, ignore_index=options.get("ignore_index", -100))
