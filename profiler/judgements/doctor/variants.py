"""The reference run of ``doctor`` and the naive loss with each known mistake.

:func:`reference` observes the model's own forward and shifted cross-entropy (the naive
loss) and keeps what it saw on the way: ``logits`` (B, T, V), the head's ``raw`` output
(B, T, V) before the model's logit transform, and the final norm's input ``prenorm`` (B, T, H).
:func:`loss_variants` recomputes the naive loss from those with each mistake a wrapper can make
(name → value, no gradient); :func:`untransformed_loss` is the one variant whose gradient the
checks compare against.

Public API: :func:`reference`, :func:`loss_variants`, :func:`untransformed_loss`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.models.source import BuiltModel
from fusedce_profiler.judgements.doctor.loss_options import LossOptions, left_out, shifted_cross_entropy
from fusedce_profiler.judgements.doctor.observe import Landmarks, Observation, naive_loss, observe


def _full(t: torch.Tensor | None) -> torch.Tensor | None:
    """The whole tensor of a sharded (DTensor) parameter (a collective: every rank calls it); any
    other tensor as it is."""
    return t.full_tensor() if type(t).__name__ == "DTensor" else t


def loss_variants(built: BuiltModel, batch: dict, store: dict, softcap: float | None,
                  options: LossOptions = LossOptions()) -> dict[str, float]:
    """The naive loss with each known mistake, from the reference's logits (no gradient); with
    config ``options``, the naive loss with each of them dropped."""
    labels = batch["labels"]
    logits = store["logits"].float()
    v = logits.shape[-1]

    def ce(lg, tg, **kw):
        return float(F.cross_entropy(lg.reshape(-1, v), tg.reshape(-1), ignore_index=IGNORE_INDEX, **kw))

    def transform(raw):
        return softcap * torch.tanh(raw / softcap) if softcap else raw

    out = {"targets not shifted": ce(logits, labels),
           "targets shifted twice": ce(logits[:, :-2], labels[:, 2:]),
           "padding trained as token 0": ce(logits[:, :-1], labels[:, 1:].clamp(min=0)),
           "as a sum": ce(logits[:, :-1], labels[:, 1:], reduction="sum")}
    per_token = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX,
                                reduction="none")
    valid = (labels[:, 1:] != IGNORE_INDEX).sum(1).clamp(min=1)
    out["mean of per-sequence means"] = float((per_token.sum(1) / valid).mean())
    for name, without in left_out(options):
        out[name] = float(shifted_cross_entropy(logits, labels, without))
    raw = store.get("raw")
    with torch.no_grad():
        if raw is not None:
            raw = raw.float()
            transformed = not torch.allclose(raw, logits, rtol=1e-3, atol=1e-3)
            if transformed:
                out["on the head's raw output (no transform)"] = ce(raw[:, :-1], labels[:, 1:])
            consistent = torch.allclose(transform(raw), logits, rtol=1e-2, atol=1e-2)
            bias = _full(built.head.bias)
            if bias is not None and consistent:
                out["without the head's bias"] = ce(transform(raw - bias.float())[:, :-1], labels[:, 1:])
            prenorm = store.get("prenorm")
            if prenorm is not None and consistent and built.head.info.plain_linear:
                no_norm = F.linear(prenorm.float(), _full(built.head.weight).float(),
                                   bias.float() if bias is not None else None)
                out["without the final norm"] = ce(transform(no_norm)[:, :-1], labels[:, 1:])
    return out


def untransformed_loss(built: BuiltModel, batch: dict) -> torch.Tensor:
    """The shifted cross-entropy of the head's raw output (the model's logit transform left out)."""
    captured = []
    handle = built.head.module.register_forward_hook(lambda mod, args, out: captured.append(out))
    try:
        built.call(batch["input_ids"])
    finally:
        handle.remove()
    raw = captured[-1]
    return F.cross_entropy(raw[:, :-1].float().reshape(-1, raw.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX)


def reference(built: BuiltModel, landmarks: Landmarks, batch: dict, mode: str,
              options: LossOptions = LossOptions()) -> tuple[Observation, dict]:
    """The naive loss observed under ``mode`` (see the module docstring), and what it stored."""
    store: dict = {}
    handles = []
    if landmarks.producer is not None:
        def on_producer(module, args) -> None:  # returns None: a pre-hook's return value replaces the args
            if args and isinstance(args[0], torch.Tensor):
                store.setdefault("prenorm", args[0].detach())

        handles.append(landmarks.producer.register_forward_pre_hook(on_producer))
    try:
        ref = observe(built, landmarks, lambda m, b: naive_loss(built, b, store, options), batch, mode)
    finally:
        for h in handles:
            h.remove()
    return ref, store
