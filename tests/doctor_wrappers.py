"""Loss wrappers for the doctor's training-situation checks: one planted mistake per check and
the correct wiring it is told apart from. Each is a ``--loss tests.doctor_wrappers:<name>`` target
on the models of tests/doctor_models.py (``model.body`` → final norm output, ``model.head.inner``
the head's Linear)."""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from fusedce import linear_cross_entropy


#: (check, planted mistake, correct wiring, model of tests/doctor_models.py) for the checks of the
#: situations training puts a loss in; the tests and the device suite run these.
TRAINING_CASES = [
    ("fresh", "stale_copy", "correct", "untied"),
    ("fresh", "stale_copy", "correct", "tied"),
    ("accumulation", "accumulation_ignores_count", "accumulation_correct", "untied"),
    ("all-ignored", "all_ignored_nan", "correct", "untied"),
    ("none", "none_zero_gradients", "none_correct", "untied"),
    ("eval", "fused_only_in_training", "correct", "untied"),
    ("eval", "torch_lce_without_options", "correct", "untied"),  # where torch has linear_cross_entropy
    ("call", "empty_shard", "correct", "untied"),
    ("options", "without_z_loss", "with_config_options", "configured"),
    ("precision", "bf16_accumulated", "correct", "untied"),
]


def _shifted(model, batch):
    hidden = model.body(batch["input_ids"])[:, :-1]
    return hidden.reshape(-1, hidden.shape[-1]), batch["labels"][:, 1:].reshape(-1)


def _fused(model, batch, **kw):
    h, y = _shifted(model, batch)
    inner = model.head.inner
    return linear_cross_entropy(h, inner.weight, y, inner.bias, **kw)


def correct(model, batch):
    return _fused(model, batch)


# --- fresh: a copy of the weight made once ---------------------------------------------------
_copies: dict[int, torch.Tensor] = {}


def stale_copy(model, batch):
    weight = _copies.setdefault(id(model), model.head.inner.weight.detach().clone().requires_grad_())
    h, y = _shifted(model, batch)
    return linear_cross_entropy(h, weight, y, model.head.inner.bias)


# --- accumulation: num_items_in_batch ---------------------------------------------------------
def accumulation_correct(model, batch, num_items_in_batch=None):
    if num_items_in_batch is None:
        return _fused(model, batch)
    return _fused(model, batch, reduction="sum") / num_items_in_batch


def accumulation_ignores_count(model, batch, num_items_in_batch=None):
    return _fused(model, batch)  # a mean over this micro-batch's own labels


# --- all-ignored micro-batch -------------------------------------------------------------------
def all_ignored_nan(model, batch):
    """A hand-written masked cross-entropy: 0 / 0 on an all-ignored micro-batch, whose backward
    (∞ · 0) puts NaN into every gradient."""
    h, y = _shifted(model, batch)
    logp = F.log_softmax(model.head(h).float(), dim=-1)
    mask = (y != -100).float()
    nll = -logp.gather(1, y.clamp(min=0)[:, None])[:, 0]
    return (nll * mask).sum() / mask.sum()


# --- reduction="none" --------------------------------------------------------------------------
def none_correct(model, batch, reduction="mean"):
    return _fused(model, batch, reduction=reduction)


class _ZeroGradWhereIgnored(torch.autograd.Function):
    """The library bug reported for fused losses: per-row losses whose backward is zero as soon
    as any row is ignored."""

    @staticmethod
    def forward(ctx, per_row, target):
        ctx.any_ignored = bool((target == -100).any())
        return per_row.clone()

    @staticmethod
    def backward(ctx, grad):
        return (torch.zeros_like(grad) if ctx.any_ignored else grad), None


def none_zero_gradients(model, batch, reduction="mean"):
    if reduction != "none":
        return _fused(model, batch, reduction=reduction)
    _, y = _shifted(model, batch)
    return _ZeroGradWhereIgnored.apply(_fused(model, batch, reduction="none"), y)


# --- torch.compile ---------------------------------------------------------------------------
def compile_mishandles_ignored(model, batch):
    h, y = _shifted(model, batch)
    if torch.compiler.is_compiling():  # a traced path that forgets the ignored targets
        y = y.clamp(min=0)
    return linear_cross_entropy(h, model.head.inner.weight, y, model.head.inner.bias)


# --- evaluation -----------------------------------------------------------------------------
def fused_only_in_training(model, batch):
    if model.training and torch.is_grad_enabled():
        return _fused(model, batch)
    logits = model(batch["input_ids"])[:, :-1]  # the model's own N×V logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1))


def torch_lce_without_options(model, batch):
    h, y = _shifted(model, batch)
    return F.linear_cross_entropy(h, model.head.inner.weight, y, linear_bias=model.head.inner.bias,
                                  ignore_index=-100)


# --- the weight at the call --------------------------------------------------------------------
def empty_shard(model, batch):
    weight = model.head.inner.weight
    shard = weight.new_empty(0).requires_grad_()  # a ZeRO-3 parameter read outside its gather
    h, y = _shifted(model, batch)
    return linear_cross_entropy(h, shard, y)


# --- options from the config ---------------------------------------------------------------------
def with_config_options(model, batch):
    config = model.config
    return _fused(model, batch, label_smoothing=config.label_smoothing, z_loss=config.z_loss)


def without_z_loss(model, batch):
    return _fused(model, batch, label_smoothing=model.config.label_smoothing)


# --- grad_W accumulation precision -------------------------------------------------------------
class _Bf16Accumulated(torch.autograd.Function):
    """hidden @ weight.T whose weight gradient is summed over row chunks in a bf16 buffer."""

    CHUNK = 4

    @staticmethod
    def forward(ctx, hidden, weight):
        ctx.save_for_backward(hidden, weight)
        return hidden @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        total = torch.zeros(weight.shape, dtype=torch.bfloat16, device=weight.device)
        for start in range(0, hidden.shape[0], _Bf16Accumulated.CHUNK):
            rows = slice(start, start + _Bf16Accumulated.CHUNK)
            total += (grad[rows].t().float() @ hidden[rows].float()).to(torch.bfloat16)
        return (grad @ weight.to(grad.dtype)).to(hidden.dtype), total.to(weight.dtype)


def bf16_accumulated(model, batch):
    h, y = _shifted(model, batch)
    logits = _Bf16Accumulated.apply(h, model.head.inner.weight)
    if model.head.inner.bias is not None:
        logits = logits + model.head.inner.bias
    return F.cross_entropy(logits.float(), y)


# --- hostile callables -------------------------------------------------------------------------
def raises(model, batch):
    raise RuntimeError("the wrapper's own bug")


def exits_zero(model, batch):
    sys.exit(0)


def exits_seven(model, batch):
    sys.exit(7)


class Unprintable(BaseException):
    """An exception whose message cannot be formed: its ``__str__`` raises."""

    def __str__(self):
        raise ValueError("the message exploded")


def raises_unprintable(model, batch):
    raise Unprintable()


def returns_int(model, batch):
    return 3


def returns_vector(model, batch):
    return torch.zeros(4, requires_grad=True)


def hangs(model, batch):
    time.sleep(3600)


def allocates(model, batch):
    hoard = []
    while True:
        hoard.append(torch.ones(1 << 26))  # 256 MiB a step


def four_required(model, batch, extra, more):
    return _fused(model, batch)


# --- sharded (FSDP2) models ----------------------------------------------------------------------
def fsdp_correct(model, batch):
    """The head's weight gathered outside its module's forward: ``full_tensor()`` (differentiable)."""
    h, y = _shifted(model, batch)
    return linear_cross_entropy(h, model.head.inner.weight.full_tensor(), y)


def fsdp_dtensor_weight(model, batch):
    """The sharded parameter passed as it is: a DTensor beside the plain hidden states."""
    h, y = _shifted(model, batch)
    return linear_cross_entropy(h, model.head.inner.weight, y)
