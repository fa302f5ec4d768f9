"""A GPT-style decoder built from a :class:`~fusedce_profiler.instrument.models.configs.ModelConfig`, randomly initialised.

Like a real model, ``forward(input_ids)`` returns the (B, T, V) logits through
``self.lm_head`` (soft-capped when the config says so); ``hidden_states(input_ids)`` are the
final hidden states (after the final norm) that the head reads, ``trunk(input_ids)`` the
residual stream before that norm. The LM head's weight is ``model.lm_head_weight`` (V, H) —
the token embedding itself when the config ties them. A training step finds the head's
input with a forward pre-hook on ``lm_head`` (:mod:`fusedce_profiler.instrument.step.step`), so the part of
the step that differs between back-ends is exactly the head and the loss.
:class:`HiddenStatesGPT` is the same model whose ``forward`` returns the hidden states: the
contract of ``doctor`` and ``parity`` wrappers.

Attention is ``sdpa`` (``F.scaled_dot_product_attention``, causal) or ``eager`` (scores and
probabilities materialised as B × heads × T × T tensors, as many hand-written models do).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from fusedce_profiler.instrument.models.configs import ModelConfig

ATTENTION_IMPLS = ("sdpa", "eager")


class RMSNorm(nn.Module):
    """``x / rms(x) · weight``, computed in fp32 and returned in the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.hidden_size, config.norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)


def rotary_tables(seq: int, head_dim: int, device: torch.device, base: float = 10000.0):
    """cos/sin tables of shape (T, head_dim/2), fp32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x: (B, heads, T, d) by the tables."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Causal multi-head (or grouped-query) self-attention without biases."""

    def __init__(self, config: ModelConfig, impl: str) -> None:
        super().__init__()
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
        self.impl = impl
        self.heads, self.kv_heads, self.head_dim = (config.num_attention_heads, config.kv_heads,
                                                    config.attention_head_dim)
        self.rope = config.position == "rope"
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = rotary_tables(t, self.head_dim, x.device)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, heads, T, T)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            out = probs @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    """``down(gelu(up(x)))`` or, gated, ``down(silu(gate(x)) · up(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gated = config.mlp == "gated"
        self.up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False) if self.gated else None
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, attention: str) -> None:
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = Attention(config, attention)
        self.mlp_norm = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Token embedding → N blocks → final norm → LM head.

    ``forward(input_ids: (B, T) int64) -> logits: (B, T, V)`` in the autocast dtype (or the
    parameter dtype without autocast); ``hidden_states(input_ids) -> (B, T, H)``;
    ``logits(hidden)`` is the head (and soft-cap) alone.
    """

    def __init__(self, config: ModelConfig, *, attention: str = "sdpa", checkpointing: bool = False,
                 seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.checkpointing = checkpointing
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.pos_embed = (nn.Embedding(config.max_position_embeddings, config.hidden_size)
                          if config.position == "learned" else None)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.num_hidden_layers))
        self.final_norm = make_norm(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None) -> None:
        """GPT-2-style init (normal, std 0.02; residual outputs scaled by 1/√(2·layers))."""
        device = self.embed.weight.device
        gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        out_std = 0.02 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, param in self.named_parameters():
            if param.dim() < 2:
                param.copy_(torch.zeros_like(param) if name.endswith("bias") else torch.ones_like(param))
                continue
            std = out_std if name.endswith(("o_proj.weight", "down.weight")) else 0.02
            param.copy_(torch.randn(param.shape, generator=gen, device=device) * std)
        if self.lm_head.bias is not None:
            self.lm_head.bias.zero_()

    @property
    def lm_head_weight(self) -> nn.Parameter:
        """(V, H): the head's weight (the embedding's own parameter when tied)."""
        return self.lm_head.weight

    @property
    def lm_head_bias(self) -> nn.Parameter | None:
        return self.lm_head.bias

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids → (B, T, V) logits, through ``self.lm_head`` (soft-capped if configured)."""
        logits = self.lm_head(self.hidden_states(input_ids))
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(logits / cap) if cap else logits

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids → (B, T, H) final hidden states (after the final norm)."""
        return self.final_norm(self.trunk(input_ids))

    def trunk(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids → (B, T, H) residual stream *before* the final norm."""
        _, t = input_ids.shape
        if t > self.config.max_position_embeddings and self.pos_embed is not None:
            raise ValueError(f"sequence length {t} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings} of {self.config.name!r}")
        x = self.embed(input_ids)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(t, device=input_ids.device))
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, H) → (…, V), soft-capped if the config says so."""
        out = F.linear(hidden, self.lm_head.weight, self.lm_head.bias)
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(out / cap) if cap else out


class HiddenStatesGPT(GPT):
    """:class:`GPT` whose ``forward`` returns the final hidden states (B, T, H): the model that
    ``doctor`` wrappers and ``parity`` back-ends are written against."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hidden_states(input_ids)
