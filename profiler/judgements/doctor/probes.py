"""The doctor's probes: the user's loss called again, in the situations training puts it in.

Each judge takes the :class:`~fusedce_profiler.judgements.doctor.checks.Context` and calls the
user's loss once more under the doctor's precision, on the model the checks used (train mode):

- ``fresh``: the head's weight takes an in-place gradient step between two calls, as an
  optimizer step moves it; the user's loss must follow. Its relative move is compared with the model's own and
  with the move of a copy made before the step (the body and a tied embedding moved, the copy
  did not); within a quarter of the gap from the copy's, it is a copy. A loss that keeps a copy
  of the weight made once (``W = head.weight.detach().clone().requires_grad_()``) does not move.
- ``accumulation``: the same tokens as one batch and as two micro-batches with uneven numbers of
  valid labels. A loss that takes ``num_items_in_batch`` (the Hugging Face convention) is given
  the global count, and its micro-batch losses must sum to the whole batch's loss and gradients;
  one that ignores it (a mean per micro-batch) is named.
- ``all-ignored``: a micro-batch whose every label is -100 must give finite (zero) gradients.
- ``none``: a loss that takes ``reduction`` returns, for ``"none"``, one value per position, 0
  where the label is ignored, whose sum has the gradient of the summed naive loss.
- ``compile``: ``torch.compile(loss)`` against the eager loss on the padded batch: the same
  loss and gradients.

Public API: :data:`JUDGES`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.callables import what_it_raised
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.judgements.doctor.checks import Context, body_names, close, norm
from fusedce_profiler.judgements.doctor.loss_options import shifted_cross_entropy
from fusedce_profiler.judgements.doctor.observe import naive_loss, observe, same_random_draws
from fusedce_profiler.judgements.doctor.precision import gradient_groups, relative_errors

_STEP = 0.2  # the in-place step lowers the model's own loss by about this fraction (to first order)
_FOLLOWS = 0.25  # a loss this close (in units of the gap) to the copy's move did not follow the step


def _value(c: Context, loss_fn) -> float:
    """``loss_fn(model, batch)`` without backward, under the doctor's precision, in train mode."""
    device = c.batch["input_ids"].device
    with same_random_draws(device), autocast(c.mode, device):
        loss = loss_fn(c.built.module, c.batch)
    return float(loss.detach().float())


def _stale_value(c: Context, old_weight: torch.Tensor, head_input: torch.Tensor) -> float | None:
    """The model's loss after the step with the head multiplying by ``old_weight`` (what a copy
    made once computes: the body — and a tied embedding — moved, the copy did not); ``None``
    where the head is not a plain linear layer."""
    if not c.built.head.info.plain_linear or "on the head's raw output (no transform)" in c.variants:
        return None
    bias = c.built.head.bias
    with torch.no_grad():
        logits = F.linear(head_input.float(), old_weight.float(), bias.float() if bias is not None else None)
        return float(shifted_cross_entropy(logits, c.batch["labels"], c.options))


def _check_fresh(c: Context) -> tuple[str, str]:
    if norm(c.user.grad(c.weight_name)) == 0 and not c.user.seen:
        return "n/a", (f"your loss gives {c.weight_name} no gradient and used no copy of it: it multiplies by another "
                       "parameter (judged by the weight check)")
    if type(c.built.head.weight).__name__ == "DTensor":
        return "n/a", "the head's weight is sharded (a DTensor): no in-place step is taken on its shards"
    weight = c.built.head.weight  # the bias stays: a loss that drops it moves differently, judged by "bias"
    saved = weight.detach().clone()
    grad = c.ref.grad(c.weight_name)
    store: dict = {}
    reference = lambda m, b: naive_loss(c.built, b, store, c.options)  # noqa: E731
    try:
        user0, ref0 = _value(c, c.fn), _value(c, reference)
        if grad is None or norm(grad) == 0:
            return "unclear", f"the model's own loss gives {c.weight_name} no gradient to step along"
        # A gradient-descent step sized to lower the model's loss by about _STEP of itself (to first order).
        rate = _STEP * abs(ref0) / norm(grad) ** 2
        with torch.no_grad():
            weight.sub_((rate * grad).to(weight))
        user1, ref1 = _value(c, c.fn), _value(c, reference)
    except Exception as exc:  # noqa: BLE001 - the user's loss failing here is evidence
        return "fail", f"your loss raised when called a second time: {what_it_raised(exc)}"
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    stale = _stale_value(c, saved, store["head_input"])
    stale = ref0 if stale is None else stale
    # Relative moves, so that a loss scaled by a constant (judged by "reduction") still follows.
    moved, expected, copied = user1 / user0 - 1, ref1 / ref0 - 1, stale / ref0 - 1
    numbers = (f"after an in-place gradient step on {c.weight_name} your loss moved {moved:+.3%}, the "
               f"model's own {expected:+.3%}, a copy of the weight made before the step would move {copied:+.3%}")
    if abs(expected - copied) <= c.loss_tolerance:
        return "unclear", numbers + ": the step moved the model's own loss too little to judge"
    if abs(moved - copied) <= _FOLLOWS * abs(expected - copied):
        return "fail", (numbers + ": your loss did not follow the step — it multiplies by a copy of the head's weight "
                        "made once (e.g. weight.detach().clone() kept between calls); read the parameter at every call")
    return "pass", numbers + " (how far it moves is judged by the value checks)"


def _valid_count(batch: dict) -> int:
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def _rows(batch: dict, rows: list[int]) -> dict:
    return {k: v[rows] for k, v in batch.items()}


def _micro_batches(batch: dict) -> list[dict]:
    """Two micro-batches with uneven numbers of valid labels: the most padded row alone, the rest."""
    counts = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(1).tolist()
    alone = min(range(len(counts)), key=lambda r: (counts[r], r))
    return [_rows(batch, [alone]), _rows(batch, [r for r in range(len(counts)) if r != alone])]


def _check_accumulation(c: Context) -> tuple[str, str]:
    micro = _micro_batches(c.batch)
    total = _valid_count(c.batch)
    counts = [_valid_count(m) for m in micro]
    groups = gradient_groups(c.weight_name, c.bias_name, body_names(c))
    if "num_items_in_batch" not in c.keywords:
        per_micro = [observe(c.built, c.landmarks, c.fn, m, c.mode) for m in micro]
        if any(o.loss is None for o in per_micro):
            return "unclear", f"your loss failed on a micro-batch: {next(o.error for o in per_micro if o.error)}"
        averaged = sum(o.loss for o in per_micro) / len(micro)
        weighted = sum(o.loss * n for o, n in zip(per_micro, counts)) / total
        return "n/a", (f"your loss takes no num_items_in_batch, so it cannot know the global token count: over "
                       f"micro-batches of {counts[0]} and {counts[1]} valid labels, the mean of their losses is "
                       f"{averaged:.6g}, the whole batch's {c.user.loss:.6g} (weighting each by its count gives "
                       f"{weighted:.6g}); accumulate with weights n_i / N, or accept num_items_in_batch and divide "
                       "the sum by it")
    accumulated = observe(c.built, c.landmarks, lambda m, b: sum(c.fn(m, mb, num_items_in_batch=total) for mb in micro),
                          c.batch, c.mode)
    if accumulated.error is not None:
        return "fail", f"your loss raised when given num_items_in_batch={total}: {accumulated.error}"
    errors = relative_errors(accumulated.grads, c.user.grads, groups)
    worst = max(errors.values(), default=0.0)
    numbers = (f"micro-batches of {counts[0]} and {counts[1]} valid labels, num_items_in_batch={total}: summed loss "
               f"{accumulated.loss:.6g}, the whole batch's {c.user.loss:.6g}; gradient error "
               f"{', '.join(f'{k} {v:.2e}' for k, v in errors.items())}")
    if close(accumulated.loss, c.user.loss, c.loss_tolerance) and worst <= c.tolerance:
        return "pass", numbers
    means = [observe(c.built, c.landmarks, c.fn, m, c.mode).loss for m in micro]
    if all(m is not None for m in means) and close(accumulated.loss, sum(means), c.loss_tolerance):
        return "fail", (numbers + ": each micro-batch is a mean over its own labels (num_items_in_batch ignored), so "
                        f"the accumulated loss is about {len(micro)}× the batch's and tokens of short micro-batches "
                        "weigh more; divide the summed loss by num_items_in_batch")
    return "fail", numbers + ": the micro-batch losses do not add up to the whole batch's"


def _check_all_ignored(c: Context) -> tuple[str, str]:
    batch = dict(c.batch, labels=torch.full_like(c.batch["labels"], IGNORE_INDEX))
    seen = observe(c.built, c.landmarks, c.fn, batch, c.mode)
    if seen.error is not None:
        return "fail", f"your loss raised on a micro-batch whose every label is -100: {seen.error}"
    bad = [n for n, g in seen.grads.items() if g is not None and not bool(torch.isfinite(g).all())]
    if bad:
        return "fail", (f"on a micro-batch whose every label is -100 your loss gives {seen.loss} and non-finite "
                        f"gradients in {len(bad)} parameters (e.g. {bad[0]}): one such micro-batch poisons the weights; "
                        "divide by max(count, 1) or by the global count")
    largest = max((norm(g) for g in seen.grads.values() if g is not None), default=0.0)
    if largest > 0:
        return "fail", (f"on a micro-batch whose every label is -100 your loss trains the model (‖grad‖ up to "
                        f"{largest:.3g}): ignored tokens contribute")
    note = "" if seen.loss is not None and math.isfinite(seen.loss) else \
        " (the value itself is NaN, as F.cross_entropy's mean over no token is: leave it out of logged averages)"
    return "pass", f"loss {seen.loss}, every gradient finite and zero{note}"


def _check_none(c: Context) -> tuple[str, str]:
    if "reduction" not in c.keywords:
        return "n/a", "your loss takes no reduction argument"
    labels = c.batch["labels"]
    positions = labels[:, 1:]
    store: dict = {}

    def summed(model, batch):
        per = c.fn(model, batch, reduction="none")
        store["per"] = per.detach().float().reshape(-1)
        return per.float().sum()

    seen = observe(c.built, c.landmarks, summed, c.batch, c.mode)
    if seen.error is not None:
        return "fail", f"your loss raised with reduction='none': {seen.error}"
    per = store["per"]
    if per.numel() != positions.numel():
        return "fail", f"reduction='none' returned {per.numel()} values for {positions.numel()} predicted positions"
    ignored = (positions.reshape(-1) == IGNORE_INDEX).to(per.device)
    leak = float(per[ignored].abs().max()) if bool(ignored.any()) else 0.0
    count = _valid_count(c.batch)
    scaled = {n: (g * count if g is not None else None) for n, g in c.ref.grads.items()}
    errors = relative_errors(seen.grads, scaled, gradient_groups(c.weight_name, c.bias_name, body_names(c)))
    worst = max(errors.values(), default=0.0)
    numbers = (f"reduction='none': {per.numel()} values, up to {leak:.3g} at ignored positions; the gradient of "
               f"their sum against the summed naive loss's: {', '.join(f'{k} {v:.2e}' for k, v in errors.items())}")
    if leak > 0:
        return "fail", numbers + ": ignored positions must hold 0"
    if norm(seen.grad(c.weight_name)) == 0:
        return "fail", numbers + ": the per-position losses carry no gradient (zero gradients with ignored rows)"
    return ("pass" if worst <= c.tolerance else "fail"), numbers


def _check_compile(c: Context) -> tuple[str, str]:
    if not c.compile_backend:
        return "n/a", "torch.compile not checked (no compile back-end asked for)"
    import torch._dynamo

    torch._dynamo.reset()
    try:
        compiled = torch.compile(c.fn, backend=c.compile_backend)
        seen = observe(c.built, c.landmarks, compiled, c.batch, c.mode, record_calls=False)
    finally:
        torch._dynamo.reset()
    if seen.error is not None:
        return "unclear", f"torch.compile(backend={c.compile_backend!r}) of your loss failed: {seen.error}"
    errors = relative_errors(seen.grads, c.user.grads, gradient_groups(c.weight_name, c.bias_name, body_names(c)))
    rel = abs(seen.loss - c.user.loss) / max(abs(c.user.loss), 1e-12)
    numbers = (f"torch.compile(backend={c.compile_backend!r}) on the padded batch: loss {seen.loss:.6g}, eager "
               f"{c.user.loss:.6g} (relative {rel:.2e}); gradients {', '.join(f'{k} {v:.2e}' for k, v in errors.items())}"
               f" (tolerance {c.tolerance:.1e})")
    if rel <= c.loss_tolerance and max(errors.values(), default=0.0) <= c.tolerance:
        return "pass", numbers
    return "fail", numbers + ": compiled and eager disagree where targets are ignored"


#: key → judge (see the module docstring).
JUDGES = {"fresh": _check_fresh, "accumulation": _check_accumulation, "all-ignored": _check_all_ignored,
          "none": _check_none, "compile": _check_compile}
