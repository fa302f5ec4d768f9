"""A GPT written for the blind benchmarks of ``explain``, sharing no code with the built-in model or
Hugging Face's: a second implementation of the ``user-gpt`` shapes whose activations ``explain``
does not model.

Written in the style of small training repositories: one fused ``qkv`` projection per block,
pre-LayerNorm, learned positions, GELU with the tanh approximation, an untied head, no dropout.
Attention is ``F.scaled_dot_product_attention(is_causal=True)`` (:func:`sdpa_gpt`) or spelled out
— ``q @ kᵀ / √d``, a causal ``masked_fill``, softmax, ``@ v`` (:func:`eager_gpt`), which keeps the
B·heads·T² scores and probabilities for backward.

:func:`eager_gpt` and :func:`sdpa_gpt` are ``--model`` factories
(``benchmarks.blind_models:sdpa_gpt``): given the parsed ``ModelConfig`` (V, H, layers, heads, FFN,
positions) they return a module whose ``forward(input_ids)`` (B, T) int64 returns the logits
(B, T, V).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention over (B, T, H) with one ``qkv`` projection (H → 3H)."""

    def __init__(self, hidden: int, heads: int, spelled_out: bool) -> None:
        super().__init__()
        self.n_head, self.spelled_out = heads, spelled_out
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.n_head, h // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.spelled_out:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, h))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x)) with a tanh-GELU MLP (H → FFN → H)."""

    def __init__(self, hidden: int, heads: int, ffn: int, spelled_out: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, spelled_out)
        self.fc, self.out = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class BlindGPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and an untied head;
    :meth:`gradient_checkpointing_enable` recomputes each block in backward."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, positions: int,
                 spelled_out: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(positions, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, spelled_out) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self.checkpointing = True

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output (B, T, H), what the LM head multiplies."""
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.ln_f(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden_states(ids))


def _from_config(config, spelled_out: bool) -> BlindGPT:
    return BlindGPT(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                    config.intermediate_size, config.max_position_embeddings, spelled_out)


def eager_gpt(config) -> BlindGPT:
    """The blind GPT with attention spelled out, at ``config``'s shapes (a ``--model`` factory)."""
    return _from_config(config, spelled_out=True)


def sdpa_gpt(config) -> BlindGPT:
    """The blind GPT with ``scaled_dot_product_attention``, at ``config``'s shapes (a ``--model`` factory)."""
    return _from_config(config, spelled_out=False)
