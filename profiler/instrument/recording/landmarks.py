"""The landmarks a recorded step hooks in the user's model: LM head, final norm, embedding, config.

- :func:`find_head`: the LM head (a Hugging Face model inside any wrapper is found by its
  ``get_output_embeddings()``, else :func:`fusedce_profiler.instrument.models.head.locate_head`);
- :func:`find_final_norm`: the last norm outside the head (its forward's end begins ``loss``);
- :func:`find_embedding`: the input embedding (its inputs give the batch's (B, T));
- :func:`model_config`: the config with attention-head counts (for the logits detector);
- :func:`batch_shape`: (B, T) of a batch's input ids.
"""
from __future__ import annotations

import torch
from torch import nn

from fusedce_profiler.instrument.models.head import Head, locate_head


def batch_shape(obj) -> tuple[int, int] | None:
    """(B, T) of the first 2-D integer tensor in ``obj`` (a tensor, a dict — ``input_ids``
    first —, a list/tuple or an object with ``input_ids``), else ``None``."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 2 and not obj.is_floating_point() and obj.dtype != torch.bool:
            return int(obj.shape[0]), int(obj.shape[1])
        return None
    if isinstance(obj, dict):
        values = ([obj["input_ids"]] if "input_ids" in obj else []) + list(obj.values())
        for value in values:
            found = batch_shape(value)
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for value in obj:
            found = batch_shape(value)
            if found:
                return found
        return None
    ids = getattr(obj, "input_ids", None)
    return batch_shape(ids) if isinstance(ids, torch.Tensor) else None


def _hf_owner(model: nn.Module) -> nn.Module | None:
    """The first module (the model itself or a descendant) with a working get_output_embeddings()."""
    for module in model.modules():
        get = getattr(module, "get_output_embeddings", None)
        if callable(get):
            try:
                if get() is not None:
                    return module
            except (NotImplementedError, AttributeError):
                continue
    return None


def find_head(model: nn.Module, *, vocab: int | None = None, head_path: str | None = None) -> Head | None:
    """The LM head of ``model`` (a LightningModule or any wrapper works: a Hugging Face model
    inside is found by its get_output_embeddings()); ``None`` when nothing fits."""
    if head_path:
        return locate_head(model, vocab=vocab, head_path=head_path)
    owner = _hf_owner(model)
    try:
        head = locate_head(owner if owner is not None else model, vocab=vocab)
    except ValueError:
        return None
    if owner is not None and owner is not model:
        prefix = next(name for name, m in model.named_modules() if m is owner)
        head.info.path = f"{prefix}.{head.info.path}" if prefix else head.info.path
        head.info.weight = f"{prefix}.{head.info.weight}"
        head.info.weight_aliases = [f"{prefix}.{a}" for a in head.info.weight_aliases]
        head.info.bias = f"{prefix}.{head.info.bias}" if head.info.bias else None
    return head


def find_final_norm(model: nn.Module, head: Head | None) -> nn.Module | None:
    """The last module (in registration order) whose class name contains "norm", outside the head."""
    inside = {id(m) for m in head.module.modules()} if head is not None else set()
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower() and id(m) not in inside
             and not any("norm" in type(c).__name__.lower() for c in m.children())]
    return norms[-1] if norms else None


def find_embedding(model: nn.Module, vocab: int | None) -> nn.Module | None:
    owner = _hf_owner(model)
    if owner is not None:
        try:
            emb = owner.get_input_embeddings()
            if isinstance(emb, nn.Module):
                return emb
        except (NotImplementedError, AttributeError):
            pass
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    matching = [m for m in embeddings if vocab is not None and m.num_embeddings == vocab]
    return (matching or embeddings or [None])[0]


def model_config(model: nn.Module):
    """The first ``config`` attribute with attention-head counts in the module tree, else ``None``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and any(isinstance(getattr(config, a, None), int)
                                      for a in ("num_attention_heads", "n_head")):
            return config
    return None


def describe_model(model: nn.Module) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({count / 1e6:.1f} M parameters)"
