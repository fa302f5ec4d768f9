"""Small causal language models in four styles, built from scratch for the blind doctor cases.

Every factory returns an ``nn.Module`` whose ``forward(input_ids)`` — ``input_ids`` (B, T) int64 —
returns the (B, T, V) fp32 logits the model trains on (or an object with ``.logits``). Sizes are tiny
(V = 128, H = 32, 2 layers) so a doctor run takes seconds on a CPU.

- :func:`plain_gpt`: pre-norm GPT, LayerNorm, untied ``lm_head`` without bias.
- :func:`tied_gpt`: RMSNorm GPT whose ``lm_head.weight`` *is* ``tok.weight`` (one shared Parameter).
- :func:`hf_gpt2`, :func:`hf_llama_untied`, :func:`hf_llama_tied`, :func:`hf_llama_smoothed`:
  Hugging Face models from tiny configs (random weights); the last asks for label smoothing 0.1
  through ``config.label_smoothing``.
- :func:`softcap_gpt`: logits soft-capped, ``cap · tanh(z / cap)`` with cap = 3 and a head large
  enough (logits' spread ≈ 6) that the cap changes the loss by order 1.
- :func:`scaled_gpt`: logits multiplied by a fixed output multiplier 0.2 (μP / Cohere style).

:func:`parts` says, for any of them, what a user who knows the model would feed a fused loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 128
HIDDEN = 32
LAYERS = 2
HEADS = 2
MAX_LEN = 64
SOFTCAP = 3.0
OUTPUT_MULTIPLIER = 0.2
LABEL_SMOOTHING = 0.1


class RMSNorm(nn.Module):
    """x / rms(x) · g over the last dim, eps 1e-6."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.gain


class CausalBlock(nn.Module):
    """Pre-norm block: causal multi-head attention (SDPA) then a GELU MLP, both residual."""

    def __init__(self, dim: int, heads: int, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class Trunk(nn.Module):
    """Token + learned position embeddings, blocks, final norm: (B, T) int64 → (B, T, H)."""

    def __init__(self, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(MAX_LEN, HIDDEN)
        self.blocks = nn.ModuleList(CausalBlock(HIDDEN, HEADS, norm) for _ in range(LAYERS))
        self.final_norm = norm(HIDDEN)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)


class PlainGPT(nn.Module):
    """Untied head: ``lm_head`` (V × H, no bias) on the trunk's output."""

    def __init__(self, norm: Callable[[int], nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.trunk = Trunk(norm)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.trunk(input_ids))


class TiedGPT(PlainGPT):
    """RMSNorm trunk; ``lm_head.weight`` is the token embedding's Parameter (one tensor, two uses),
    initialised N(0, 0.1²) so the logits spread ≈ 0.6 like an untied head's."""

    def __init__(self) -> None:
        super().__init__(norm=RMSNorm)
        nn.init.normal_(self.trunk.tok.weight, std=0.1)
        self.lm_head.weight = self.trunk.tok.weight


class SoftcapGPT(PlainGPT):
    """Logits ``SOFTCAP · tanh(z / SOFTCAP)`` of the head's z; head initialised N(0, 1) so z spreads ≈ √H."""

    def __init__(self) -> None:
        super().__init__()
        nn.init.normal_(self.lm_head.weight, std=1.0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        z = self.lm_head(self.trunk(input_ids))
        return SOFTCAP * torch.tanh(z / SOFTCAP)


class ScaledGPT(PlainGPT):
    """Logits ``OUTPUT_MULTIPLIER · z``; head initialised N(0, 1), so the multiplier matters."""

    def __init__(self) -> None:
        super().__init__()
        nn.init.normal_(self.lm_head.weight, std=1.0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.trunk(input_ids)) * OUTPUT_MULTIPLIER


def plain_gpt() -> PlainGPT:
    return PlainGPT()


def tied_gpt() -> TiedGPT:
    return TiedGPT()


def softcap_gpt() -> SoftcapGPT:
    return SoftcapGPT()


def scaled_gpt() -> ScaledGPT:
    return ScaledGPT()


def hf_gpt2():
    """``GPT2LMHeadModel`` (tied, as GPT-2 is) from a tiny config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=MAX_LEN, n_embd=HIDDEN, n_layer=LAYERS,
                                      n_head=HEADS, bos_token_id=0, eos_token_id=0,
                                      tie_word_embeddings=True))


def _llama(**extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                        num_key_value_heads=HEADS, max_position_embeddings=MAX_LEN, **extra))


def hf_llama_untied():
    return _llama(tie_word_embeddings=False)


def hf_llama_tied():
    return _llama(tie_word_embeddings=True)


def hf_llama_smoothed():
    """Untied Llama whose config asks its loss for label smoothing ``LABEL_SMOOTHING``."""
    return _llama(tie_word_embeddings=False, label_smoothing=LABEL_SMOOTHING)


@dataclass
class Parts:
    """What a fused loss needs from one of these models.

    ``hidden(input_ids)``: (B, T) int64 → (B, T, H), the head's input, with its graph;
    ``weight``: the head's (V, H) trained Parameter; ``embedding``: the token embedding's (V, H)
    Parameter; ``softcap``/``multiplier``/``label_smoothing``: the transform and option the model's
    own loss applies (None / 1.0 / 0.0 when it applies none).
    """

    hidden: Callable[[torch.Tensor], torch.Tensor]
    weight: nn.Parameter
    embedding: nn.Parameter
    softcap: float | None = None
    multiplier: float = 1.0
    label_smoothing: float = 0.0


def parts(model: nn.Module) -> Parts:
    """The :class:`Parts` of any model above (a user knows their own model; this is that knowledge)."""
    if isinstance(model, PlainGPT):
        return Parts(hidden=model.trunk, weight=model.lm_head.weight, embedding=model.trunk.tok.weight,
                     softcap=SOFTCAP if isinstance(model, SoftcapGPT) else None,
                     multiplier=OUTPUT_MULTIPLIER if isinstance(model, ScaledGPT) else 1.0)
    config = model.config
    return Parts(hidden=lambda ids: model.base_model(input_ids=ids).last_hidden_state,
                 weight=model.get_output_embeddings().weight, embedding=model.get_input_embeddings().weight,
                 softcap=getattr(config, "final_logit_softcapping", None),
                 label_smoothing=getattr(config, "label_smoothing", 0.0))

