"""``doctor``: check a user's loss wrapper against the reference on a small model.

The wrapper's contract (what ``--loss module:callable`` must name)::

    def my_loss(model, input_ids, labels) -> torch.Tensor: ...

- ``model``: a :class:`profiler.models.gpt.GPT`. ``model.trunk(input_ids)`` is the (B, T, H)
  residual stream *before* the final norm, ``model.final_norm`` the final norm,
  ``model(input_ids)`` = ``model.final_norm(model.trunk(input_ids))``; ``model.lm_head`` is
  an ``nn.Linear`` (weight (V, H), bias (V,) or ``None``) whose weight *is* ``model.embed.weight``
  when the config ties them; ``model.config`` the :class:`~profiler.configs.ModelConfig`.
- ``input_ids``: (B, T) int64. ``labels``: (B, T) int64, Hugging Face convention: the same
  tokens as ``input_ids`` (not shifted), ``-100`` at padding. Position t predicts labels[t + 1].
- returns: the mean cross-entropy over the predicted positions whose label is not -100, a
  scalar whose graph reaches the model's parameters (it is back-propagated).

The reference is ``F.cross_entropy(model.logits(model(ids))[:, :-1], labels[:, 1:])`` in fp32.
Each check plants nothing in the user's code: it observes the wrapper's loss, its gradients
(of the LM head, its bias, the tied embedding, and of the trunk output, position by
position) and how the loss responds when a parameter changes, and compares with the
reference. Verdicts are ``pass``, ``fail`` or ``unclear`` (the evidence says why).
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from fusedce.options import IGNORE_INDEX
from profiler.configs import ModelConfig, get_preset
from profiler.models.gpt import GPT

LOSS_RTOL = 1e-4  # fp32 on the same weights: a correct wrapper agrees to rounding
GRAD_RTOL = 1e-3

WrapperFn = Callable[[GPT, torch.Tensor, torch.Tensor], torch.Tensor]


VERDICTS = ("pass", "fail", "unclear")


@dataclass
class Check:
    """One doctor item: ``verdict`` is "pass", "fail" or "unclear"; ``evidence`` the numbers."""

    item: str
    verdict: str
    evidence: str

    @classmethod
    def from_dict(cls, raw: object, where: str = "check") -> "Check":
        """Validate a stored check; ``ValueError`` naming the first bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be an object, got {type(raw).__name__}")
        for name in ("item", "verdict", "evidence"):
            if not isinstance(raw.get(name), str):
                raise ValueError(f"{where}.{name} must be a string, got {raw.get(name)!r}")
        if raw["verdict"] not in VERDICTS:
            raise ValueError(f"{where}.verdict must be one of {', '.join(VERDICTS)}, got {raw['verdict']!r}")
        return cls(raw["item"], raw["verdict"], raw["evidence"])


@dataclass
class DoctorRun:
    """What ``doctor`` stores as ``doctor.json``: the ``--loss`` it checked, the model config's
    name, and one :class:`Check` per item in the order they ran."""

    loss: str
    config: str
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """No item failed (an ``unclear`` item is not a failure)."""
        return not any(c.verdict == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> "DoctorRun":
        """Validate a stored run; ``ValueError`` naming the first bad field. A bare list of
        checks is read as a run whose loss and config are unknown ("")."""
        if isinstance(raw, list):
            raw = {"loss": "", "config": "", "checks": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"doctor.json must hold an object, got {type(raw).__name__}")
        for name in ("loss", "config"):
            if not isinstance(raw.get(name, ""), str):
                raise ValueError(f"{name} must be a string, got {raw.get(name)!r}")
        checks = raw.get("checks")
        if not isinstance(checks, list):
            raise ValueError(f"checks must be a list, got {checks!r}")
        return cls(raw.get("loss", ""), raw.get("config", ""),
                   [Check.from_dict(c, f"checks[{i}]") for i, c in enumerate(checks)])


def load_wrapper(spec: str) -> WrapperFn:
    """``"package.module:callable"`` → the callable; ``ValueError`` naming what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--loss: expected 'package.module:callable', got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--loss: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--loss: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--loss: {spec!r} is not callable")
    return obj


def reference_loss(model: GPT, input_ids: torch.Tensor, labels: torch.Tensor, *, shift: bool = True,
                   norm: bool = True, bias: bool = True, softcap: bool = True,
                   reduction: str = "mean") -> torch.Tensor:
    """The correct loss, or (flags off) one of the usual mistakes, for comparison.

    ``reduction``: "mean" (over valid tokens), "sum", or "seq-mean" (mean of per-sequence means).
    """
    hidden = model.trunk(input_ids)
    if norm:
        hidden = model.final_norm(hidden)
    logits = F.linear(hidden, model.lm_head.weight, model.lm_head.bias if bias else None)
    cap = model.config.final_logit_softcapping
    if cap and softcap:
        logits = cap * torch.tanh(logits / cap)
    if shift:
        logits, targets = logits[:, :-1], labels[:, 1:]
    else:
        targets = labels
    per_token = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    valid = targets != IGNORE_INDEX
    if reduction == "sum":
        return per_token.sum()
    if reduction == "seq-mean":
        return (per_token.sum(1) / valid.sum(1).clamp(min=1)).mean()
    return per_token.sum() / valid.sum()


@dataclass
class _Run:
    """One call of a loss function: its value, gradients and the trunk-output gradient."""

    loss: float | None
    error: str | None
    weight_grad: torch.Tensor | None
    bias_grad: torch.Tensor | None
    trunk_grad: torch.Tensor | None  # (B, T, H), None when the trunk output got no gradient


def _call(model: GPT, fn: Callable, input_ids: torch.Tensor, labels: torch.Tensor) -> _Run:
    """Run ``fn(model, input_ids, labels)`` and backward, capturing the gradients."""
    model.zero_grad(set_to_none=True)
    captured: dict[str, torch.Tensor] = {}

    def on_trunk(module, args, output):
        if output.requires_grad:
            output.register_hook(lambda g: captured.__setitem__("trunk", g.detach().clone()))

    handle = model.blocks[-1].register_forward_hook(on_trunk)
    try:
        loss = fn(model, input_ids, labels)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"the wrapper must return a scalar tensor, got {type(loss).__name__} "
                            f"{tuple(getattr(loss, 'shape', ()))}")
        if loss.requires_grad:
            loss.backward()
    except Exception as exc:  # the wrapper's own failure is evidence, not a crash of the doctor
        return _Run(None, f"{type(exc).__name__}: {exc}", None, None, None)
    finally:
        handle.remove()
    weight = model.lm_head.weight.grad
    bias = model.lm_head.bias.grad if model.lm_head.bias is not None else None
    run = _Run(float(loss.detach()), None, None if weight is None else weight.clone(),
               None if bias is None else bias.clone(), captured.get("trunk"))
    model.zero_grad(set_to_none=True)
    return run


def _rel(a: torch.Tensor | None, b: torch.Tensor) -> float:
    if a is None:
        return float("inf")
    norm = b.double().norm()
    return float((a.double() - b.double()).norm() / norm) if norm > 0 else float((a.double()).norm())


def _close(a: float | None, b: float, rtol: float = LOSS_RTOL) -> bool:
    return a is not None and abs(a - b) <= rtol * max(abs(b), 1e-12)


def make_batch(config: ModelConfig, batch: int = 4, seq: int = 32, seed: int = 0):
    """(input_ids, labels, pad_start): sequences 1 and 3 padded from ``pad_start[b]`` on."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (batch, seq), generator=gen)
    labels = input_ids.clone()
    pad_start = [seq] * batch
    for b, length in ((1, seq * 5 // 8), (3, seq * 7 // 8)):
        if b < batch:
            pad_start[b] = length
            input_ids[b, length:] = 0
            labels[b, length:] = IGNORE_INDEX
    return input_ids, labels, pad_start


def _doctor_model(config: ModelConfig, tied: bool, seed: int) -> GPT:
    model = GPT(dataclasses.replace(config, tie_word_embeddings=tied, lm_head_bias=True), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial bias and norm weights, so dropping either is visible
        model.lm_head.bias.copy_(torch.randn(model.lm_head.bias.shape, generator=gen) * 0.5)
        model.final_norm.weight.copy_(1 + 0.5 * torch.randn(model.final_norm.weight.shape, generator=gen))
    return model


def _response(model: GPT, fn: Callable, param: torch.Tensor, input_ids, labels, seed: int) -> tuple[float, float]:
    """(Δ user loss, Δ reference loss) when ``param`` is perturbed; ``param`` is restored."""
    with torch.no_grad():
        before_user = fn(model, input_ids, labels).item()
        before_ref = reference_loss(model, input_ids, labels).item()
        saved = param.detach().clone()
        gen = torch.Generator().manual_seed(seed + 2)
        param.add_(torch.randn(param.shape, generator=gen) * param.detach().float().std().clamp(min=0.02) * 0.5)
        try:
            after_user = fn(model, input_ids, labels).item()
            after_ref = reference_loss(model, input_ids, labels).item()
        finally:
            param.copy_(saved)
    return after_user - before_user, after_ref - before_ref


def _responds(d_user: float, d_ref: float) -> str:
    if abs(d_ref) == 0:
        return "unclear"
    ratio = d_user / d_ref
    if 0.5 <= ratio <= 2.0:
        return "pass"
    if abs(ratio) < 1e-3:
        return "fail"
    return "unclear"


def run_doctor(fn: WrapperFn, config: ModelConfig | None = None, seed: int = 0) -> list[Check]:
    """Run every check on ``fn``; returns one :class:`Check` per item, in a fixed order."""
    config = config or get_preset("tiny")
    torch.manual_seed(seed)
    model = _doctor_model(config, tied=False, seed=seed)
    input_ids, labels, pad_start = make_batch(config, seed=seed)
    batch, seq = input_ids.shape
    ref = _call(model, lambda m, i, l: reference_loss(m, i, l), input_ids, labels)
    user = _call(model, fn, input_ids, labels)
    checks: list[Check] = []

    if user.error is not None:
        checks.append(Check("the wrapper runs", "fail", f"calling it on a padded batch raised {user.error}"))
        # A wrapper that cannot take -100 labels often still runs on an unpadded batch.
        full = labels.clone()
        full[full == IGNORE_INDEX] = 0
        retry = _call(model, fn, input_ids, full)
        if retry.error is not None:
            return checks
        checks.append(Check("ignore_index (-100) honoured", "fail",
                            f"it raised on labels containing {IGNORE_INDEX} but runs without them"))
        return checks
    checks.append(Check("loss value", "pass" if _close(user.loss, ref.loss) else "fail",
                        f"yours {user.loss:.6f}, reference {ref.loss:.6f}"))

    # 1. The weight the wrapper uses is the LM head's own parameter.
    d_user, d_ref = _response(model, fn, model.lm_head.weight, input_ids, labels, seed)
    verdict = _responds(d_user, d_ref)
    checks.append(Check("uses lm_head.weight itself", verdict,
                        f"perturbing lm_head.weight changes your loss by {d_user:+.4g}, the reference by "
                        f"{d_ref:+.4g}" + (" — your loss uses a copy or another module's weight"
                                           if verdict == "fail" else "")))

    # 2. Gradients reach the LM head.
    if user.weight_grad is None or float(user.weight_grad.abs().sum()) == 0:
        checks.append(Check("gradient reaches lm_head.weight", "fail",
                            "lm_head.weight.grad is None or zero after backward (weight detached, copied "
                            "or not used)"))
    else:
        err = _rel(user.weight_grad, ref.weight_grad)
        checks.append(Check("gradient reaches lm_head.weight", "pass" if err <= 0.5 else "unclear",
                            f"relative error of lm_head.weight.grad vs reference: {err:.2e}"))

    # 3. Targets shifted: the trunk-output gradient is zero exactly where nothing is predicted.
    checks.append(_shift_check(user, ref, pad_start, seq))

    # 4. ignore_index: positions whose input is padding must get no gradient.
    checks.append(_ignore_check(user, pad_start, seq))

    # 5. Reduction: mean over valid tokens (not sum, not mean of per-sequence means).
    variants = {name: reference_loss(model, input_ids, labels, reduction=name).item()
                for name in ("sum", "seq-mean")}
    if _close(user.loss, ref.loss):
        checks.append(Check("reduction is mean over valid tokens", "pass", f"loss {user.loss:.6f} = reference"))
    else:
        hit = next((name for name, value in variants.items() if _close(user.loss, value)), None)
        checks.append(Check("reduction is mean over valid tokens", "fail" if hit else "unclear",
                            f"yours {user.loss:.6f}; mean {ref.loss:.6f}, sum {variants['sum']:.6f}, "
                            f"mean of per-sequence means {variants['seq-mean']:.6f}"
                            + (f" — matches '{hit}'" if hit else "")))

    # 6. Bias not dropped.
    no_bias = reference_loss(model, input_ids, labels, bias=False).item()
    if user.bias_grad is None or float(user.bias_grad.abs().sum()) == 0:
        checks.append(Check("lm_head.bias used", "fail",
                            f"lm_head.bias.grad is None or zero; your loss {user.loss:.6f}, reference "
                            f"{ref.loss:.6f}, reference without bias {no_bias:.6f}"))
    else:
        err = _rel(user.bias_grad, ref.bias_grad)
        checks.append(Check("lm_head.bias used", "pass" if err <= 0.5 else "unclear",
                            f"relative error of lm_head.bias.grad vs reference: {err:.2e}"))

    # 7. Final norm applied to the hidden states the loss sees.
    d_user, d_ref = _response(model, fn, model.final_norm.weight, input_ids, labels, seed)
    no_norm = reference_loss(model, input_ids, labels, norm=False).item()
    verdict = _responds(d_user, d_ref)
    checks.append(Check("final norm applied", verdict,
                        f"perturbing final_norm.weight changes your loss by {d_user:+.4g}, the reference by "
                        f"{d_ref:+.4g}; reference without the norm {no_norm:.6f}, yours {user.loss:.6f}"))

    # 8. Soft-capping, when the config has it.
    if config.final_logit_softcapping:
        uncapped = reference_loss(model, input_ids, labels, softcap=False).item()
        verdict = "pass" if _close(user.loss, ref.loss) else "fail" if _close(user.loss, uncapped) else "unclear"
        checks.append(Check("logit soft-cap applied", verdict,
                            f"yours {user.loss:.6f}, reference {ref.loss:.6f}, without soft-cap {uncapped:.6f}"))

    # 9. Tied embeddings: both gradients land in the one shared parameter.
    checks.append(_tied_check(fn, config, seed, input_ids, labels))
    return checks


def _row_norms(grad: torch.Tensor) -> torch.Tensor:
    return grad.double().norm(dim=-1)  # (B, T)


def _shift_check(user: _Run, ref: _Run, pad_start: list[int], seq: int) -> Check:
    item = "targets shifted (position t predicts labels[t+1])"
    if user.trunk_grad is None:
        return Check(item, "unclear", "the trunk output received no gradient")
    rows = _row_norms(user.trunk_grad)
    scale = float(rows.max()) or 1.0
    full = [b for b, start in enumerate(pad_start) if start == seq]
    last = max(float(rows[b, seq - 1]) for b in full) / scale if full else 0.0
    first = min(float(rows[b, 0]) for b in range(len(pad_start))) / scale
    ref_rows = _row_norms(ref.trunk_grad)
    if last < 1e-6 and first > 1e-6:
        return Check(item, "pass", f"last position gets no gradient (relative {last:.1e}), first position does "
                                   f"({first:.1e}), as in the reference")
    ref_last = max(float(ref_rows[b, seq - 1]) for b in full) / float(ref_rows.max()) if full else 0.0
    return Check(item, "fail", f"the last position of full sequences gets gradient {last:.2e} (reference "
                               f"{ref_last:.1e}): it is trained on a target the model cannot see "
                               "— labels not shifted, or shifted twice" if last >= 1e-6 else
                 f"the first position gets no gradient ({first:.1e}): shifted twice?")


def _ignore_check(user: _Run, pad_start: list[int], seq: int) -> Check:
    item = "ignore_index (-100) honoured"
    if user.trunk_grad is None:
        return Check(item, "unclear", "the trunk output received no gradient")
    rows = _row_norms(user.trunk_grad)
    scale = float(rows.max()) or 1.0
    padded = [(b, start) for b, start in enumerate(pad_start) if start < seq]
    worst = max(float(rows[b, start:].max()) for b, start in padded) / scale
    if worst < 1e-6:
        return Check(item, "pass", f"padding positions get no gradient (relative {worst:.1e})")
    return Check(item, "fail", f"padding positions get gradient up to {worst:.2e} of the largest row: "
                               "padded labels are trained on (ignore_index not passed, or a different one)")


def _tied_check(fn: WrapperFn, config: ModelConfig, seed: int, input_ids, labels) -> Check:
    item = "tied embedding gets both gradients"
    model = _doctor_model(config, tied=True, seed=seed)
    ref = _call(model, lambda m, i, l: reference_loss(m, i, l), input_ids, labels)
    user = _call(model, fn, input_ids, labels)
    if user.error is not None:
        return Check(item, "fail", f"on the tied model the wrapper raised {user.error}")
    # The embedding's share alone: the reference loss with the head's use of the weight detached.
    model.zero_grad(set_to_none=True)
    hidden = model(input_ids)
    logits = F.linear(hidden, model.lm_head.weight.detach(), model.lm_head.bias)[:, :-1]
    F.cross_entropy(logits.float().transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX).backward()
    embedding_only = model.embed.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    err = _rel(user.weight_grad, ref.weight_grad)
    if err <= GRAD_RTOL:
        return Check(item, "pass", f"shared weight's gradient matches the reference (relative error {err:.1e})")
    if user.weight_grad is not None and _rel(user.weight_grad, embedding_only) <= GRAD_RTOL:
        return Check(item, "fail", "the shared weight holds only the embedding's gradient: the loss used a "
                                   f"copy of the tied weight (relative error vs reference {err:.2e})")
    return Check(item, "unclear" if user.weight_grad is not None else "fail",
                 f"shared weight's gradient differs from the reference: relative error {err:.2e}")
