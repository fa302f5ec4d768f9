"""Loss wrappers for ``fusedce-profile doctor`` on the model of ``examples/user_model.py``.

    fusedce-profile doctor --model examples.doctor_losses:fixed_model --loss examples.doctor_losses:fused_loss
    fusedce-profile doctor --model examples.user_model:build --loss examples.doctor_losses:reports_loss
    fusedce-profile doctor --model examples.doctor_losses:fixed_model --loss examples.doctor_losses:detached_loss

The first exits 0 (every item passes); the second exits 1 on the original report's wiring (the
tie assigned on the head's wrapper, the loss given the wrapper's ``weight`` — the embedding —
while the head's forward multiplies by its inner ``proj.weight``); the third exits 1 with "gradient
reaches the body: fail" (the body never trains) and the checks that depend on it "not checked".

The contract (``doctor --loss``): ``fn(model, batch) -> loss``, where ``batch`` holds
``input_ids`` and ``labels`` (B, T) int64, labels unshifted with -100 at padding, and the loss
is the mean cross-entropy of position t against ``labels[t + 1]`` over the labels that are not
-100, with a graph back to the model's parameters.
"""
from __future__ import annotations

import torch

from examples.user_model import UserGPT
from fusedce import linear_cross_entropy


def fixed_model() -> UserGPT:
    """The report's model with the tie where the head's forward reads it: on ``head.proj``."""
    model = UserGPT()
    del model.head.weight  # the tie assigned on the wrapper, which its forward never uses
    model.head.proj.weight = model.embed.weight
    return model


def hidden_states(model: UserGPT, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 → (B, T, H): the final norm's output, what ``model.head`` reads."""
    t = input_ids.shape[1]
    x = model.embed(input_ids) + model.pos(torch.arange(t, device=input_ids.device))
    for block in model.blocks:
        x = block(x)
    return model.norm(x)


def fused_loss(model: UserGPT, batch: dict) -> torch.Tensor:
    hidden = hidden_states(model, batch["input_ids"])[:, :-1]   # position t predicts labels[t + 1]
    labels = batch["labels"][:, 1:]                             # -100 at padding: ignored
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.head.proj.weight, labels.reshape(-1))


def reports_loss(model: UserGPT, batch: dict) -> torch.Tensor:
    """The original report's wiring: the loss takes the wrapper's ``weight``."""
    hidden = hidden_states(model, batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.head.weight, labels.reshape(-1))


def detached_loss(model: UserGPT, batch: dict) -> torch.Tensor:
    """The hidden states detached before the loss: only the head trains."""
    hidden = hidden_states(model, batch["input_ids"]).detach()[:, :-1]
    labels = batch["labels"][:, 1:]
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.head.proj.weight, labels.reshape(-1))
