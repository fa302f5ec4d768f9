"""Loss wrappers in the doctor's contract, ``fn(model, batch) -> loss``, as users write them.

``batch["labels"]`` is unshifted, -100 at padding; the loss the model trains on is the mean over
labelled tokens of the cross-entropy of position t against ``labels[t + 1]``, with the model's
logit transform and label smoothing (:func:`..models.parts`). The ``correct_*`` wrappers compute
exactly that, each in another style; the ``buggy_*`` wrappers each make one mistake a user makes,
named in its docstring.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusedce import linear_cross_entropy
from tests.blind_doctor.models import parts


def _fused(p, hidden, labels, **options):
    """``linear_cross_entropy`` of (…, H) hidden against (…) labels with the model's transform.

    The output multiplier m is folded into the hidden states: (m·h) Wᵀ = m·(h Wᵀ).
    """
    options.setdefault("softcap", p.softcap)
    options.setdefault("label_smoothing", p.label_smoothing)
    h = hidden * p.multiplier if p.multiplier != 1.0 else hidden
    return linear_cross_entropy(h.flatten(0, -2), p.weight, labels.flatten(), **options)


# ---------------------------------------------------------------- correct


def correct_slice(model, batch):
    """Shift by slicing: hidden[:, :-1] predicts labels[:, 1:]."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:])


def correct_roll(model, batch):
    """Shift by rolling the labels left and ignoring the wrapped-around last column."""
    p = parts(model)
    targets = batch["labels"].roll(-1, dims=1)
    targets[:, -1] = -100
    return _fused(p, p.hidden(batch["input_ids"]), targets)


def _collate(batch):
    """A collator that adds ``shift_labels`` (padded with -100 at the end), as some trainers do."""
    return {**batch, "shift_labels": F.pad(batch["labels"][:, 1:], (0, 1), value=-100)}


def correct_collator(model, batch):
    """Labels pre-shifted by the collator; the loss uses every position."""
    batch = _collate(batch)
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"]), batch["shift_labels"])


def correct_sum_over_items(model, batch, num_items_in_batch=None):
    """``reduction="sum"`` divided by the global label count (Hugging Face's num_items_in_batch)."""
    p = parts(model)
    labels = batch["labels"][:, 1:]
    total = _fused(p, p.hidden(batch["input_ids"])[:, :-1], labels, reduction="sum")
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
    return total / count


def correct_base_then_head(model, batch):
    """Hugging Face style: the base model's last hidden state, then the output embedding's weight."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    hidden = hidden.last_hidden_state[:, :-1]
    labels = batch["labels"][:, 1:]
    config = model.config
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.get_output_embeddings().weight,
                                labels.reshape(-1), label_smoothing=getattr(config, "label_smoothing", 0.0),
                                softcap=getattr(config, "final_logit_softcapping", None))


@torch.compile(backend="aot_eager")
def _compiled_loss(hidden, weight, labels, softcap, label_smoothing):
    return linear_cross_entropy(hidden, weight, labels, softcap=softcap, label_smoothing=label_smoothing)


def correct_compiled(model, batch):
    """The loss call compiled with ``torch.compile`` (aot_eager: tracing and AOT autograd, no C++ build)."""
    p = parts(model)
    hidden = p.hidden(batch["input_ids"])[:, :-1] * p.multiplier
    return _compiled_loss(hidden.reshape(-1, hidden.shape[-1]), p.weight, batch["labels"][:, 1:].reshape(-1),
                          p.softcap, p.label_smoothing)


def correct_autocast(model, batch):
    """The forward and loss under the wrapper's own bf16 autocast (the model trains in bf16 mixed precision)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return correct_slice(model, batch)


# ---------------------------------------------------------------- buggy


def buggy_no_shift(model, batch):
    """Position t scored against labels[t]: the model learns to copy its input."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"]), batch["labels"])


def buggy_wrong_direction(model, batch):
    """Shifted the wrong way: position t + 1 scored against labels[t]."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"])[:, 1:], batch["labels"][:, :-1])


def buggy_detached(model, batch):
    """Hidden states detached: only the head trains."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"]).detach()[:, :-1], batch["labels"][:, 1:])


class _StaleClone:
    """The head's weight copied once (``detach().clone()``) on the first call and reused."""

    def __init__(self) -> None:
        self.weight = None

    def copy(self, p):
        return p.weight.detach().clone()

    def __call__(self, model, batch):
        p = parts(model)
        if self.weight is None:
            self.weight = self.copy(p)
        p.weight = self.weight
        return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:])


class _StaleData(_StaleClone):
    """The head's ``.data`` captured once: same storage, so optimizer steps show, but no gradient."""

    def copy(self, p):
        return p.weight.data


class _UntiedCopy(_StaleClone):
    """Tie broken: the loss multiplies by its own Parameter, copied once from the embedding."""

    def copy(self, p):
        return torch.nn.Parameter(p.embedding.detach().clone())


buggy_stale_clone = _StaleClone()
buggy_stale_data = _StaleData()
buggy_untied_copy = _UntiedCopy()


def buggy_mean_with_padding(model, batch):
    """Per-token losses averaged over every position, padding (0) included."""
    p = parts(model)
    per_token = _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:], reduction="none")
    return per_token.mean()


def buggy_pad_as_zero(model, batch):
    """The collator pads labels with token 0 (the pad id) instead of -100: padding is trained on."""
    p = parts(model)
    labels = batch["labels"].masked_fill(batch["labels"] == -100, 0)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], labels[:, 1:])


def buggy_ignore_zero(model, batch):
    """Padding labelled 0 and ``ignore_index=0``: padding is skipped, but so is every real token 0."""
    p = parts(model)
    labels = batch["labels"].masked_fill(batch["labels"] == -100, 0)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], labels[:, 1:], ignore_index=0)


def buggy_softcap_forgotten(model, batch):
    """The model's final-logit soft-cap left out of the loss."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:], softcap=None)


def buggy_multiplier_forgotten(model, batch):
    """The model's output multiplier left out of the loss."""
    p = parts(model)
    p.multiplier = 1.0
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:])


def buggy_smoothing_forgotten(model, batch):
    """The config's label smoothing left out of the loss."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:], label_smoothing=0.0)


def buggy_sum(model, batch):
    """``reduction="sum"`` with no normalisation: the step size grows with the label count."""
    p = parts(model)
    return _fused(p, p.hidden(batch["input_ids"])[:, :-1], batch["labels"][:, 1:], reduction="sum")


def buggy_ignores_num_items(model, batch, num_items_in_batch=None):
    """Takes ``num_items_in_batch`` but returns each micro-batch's own mean (accumulation over-weights)."""
    return correct_slice(model, batch)


def buggy_bf16_grad_sum(model, batch):
    """Weight and hidden cast to bf16 and grad_W summed per 8-row chunk in bf16 (no fp32 accumulator)."""
    p = parts(model)
    hidden = p.hidden(batch["input_ids"])[:, :-1] * p.multiplier
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]).bfloat16(), p.weight.bfloat16(),
                                batch["labels"][:, 1:].reshape(-1), softcap=p.softcap,
                                label_smoothing=p.label_smoothing, chunk_size=8, grad_weight_accumulation="per_chunk")
