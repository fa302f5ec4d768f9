"""The precision a verdict is judged in: the spread the user's precision policy puts on the model's own loss.

A correct fused loss under bf16 autocast does not reproduce the fp32 gradients: it rounds the
hidden states, the weight and the logits to bf16 as the model's own (naive) loss does, in another
order. Judging it against an fp32 limit calls correct code broken. So the doctor *measures* what
the policy costs on this model: the naive loss run under the policy (``mode``) against the same
naive loss in fp32, on ``samples`` batches of different seeds, and takes the worst relative error
of the loss and of each gradient group (the head's weight, its bias, the body):

    spread = max over batches and groups of ‖g_mode − g_fp32‖ / ‖g_fp32‖

Two independent roundings of that size (the user's loss and the reference, both under the
policy) differ by at most about twice the spread; the tolerance is

    tolerance = max(fp32 floor, SAFETY · spread)

for the gradients, and the same from the loss's own spread for loss values, with the fp32 floor of :mod:`fusedce_profiler.instrument.tolerances` (summation order, TF32).
In fp32 the spread is ~1e-7 and the floor decides; under bf16 autocast the spread is a few 1e-3
and the tolerance a few 1e-2. A planted wiring mistake errs by O(1) and still fails.

Public API: :data:`SAFETY`, :class:`Spread`, :func:`gradient_groups`, :func:`relative_errors`,
:func:`measure_spread`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fusedce_profiler.instrument.tolerances import tolerance_for

#: How many spreads apart two correct losses under the same policy may be.
SAFETY = 4.0


def _norm(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(t.double().norm())


def relative_errors(grads: dict, reference: dict, groups: dict[str, list[str]]) -> dict[str, float]:
    """Group label → ``‖g − g_ref‖ / ‖g_ref‖`` over the parameter names of the group (0 where the
    reference has no gradient there). ``grads``/``reference``: name → tensor or ``None``."""
    errors = {}
    for label, names in groups.items():
        diff = ref = 0.0
        for n in names:
            a, b = grads.get(n), reference.get(n)
            if a is None and b is None:
                continue
            delta = (a if a is not None else 0) - (b if b is not None else 0)
            diff += _norm(delta if isinstance(delta, torch.Tensor) else None) ** 2
            ref += _norm(b) ** 2
        errors[label] = math.sqrt(diff) / math.sqrt(ref) if ref else 0.0
    return errors


def gradient_groups(weight_name: str, bias_name: str | None, body: list[str]) -> dict[str, list[str]]:
    """The groups gradients are judged in: the head's weight, its bias, the body's parameters."""
    groups = {weight_name: [weight_name]}
    if bias_name:
        groups[bias_name] = [bias_name]
    if body:
        groups["the body"] = list(body)
    return groups


@dataclass
class Spread:
    """What the policy ``mode`` does to the model's own loss: ``loss`` and ``gradient`` (worst
    relative error against fp32 over ``samples`` batches, per gradient group in ``groups``), the
    resulting ``tolerance``, and the fp32 ``floor`` it never goes below."""

    mode: str
    samples: int
    loss: float
    gradient: float
    tolerance: float
    floor: float
    groups: dict[str, float] = field(default_factory=dict)
    loss_tolerance: float = 0.0

    def group_tolerances(self) -> dict[str, float]:
        """Gradient group → ``max(floor, SAFETY · its own spread)``."""
        return {k: max(self.floor, SAFETY * v) for k, v in self.groups.items()}

    def describe(self) -> str:
        if self.mode == "fp32":
            return f"fp32: tolerance {self.tolerance:.1e} (the fp32 floor; measured spread {self.gradient:.1e})"
        return (f"{self.mode} against fp32 on the model's own loss over {self.samples} batches: loss {self.loss:.1e}, "
                f"gradients {self.gradient:.1e} → tolerances {self.loss_tolerance:.1e} (loss) and "
                f"{self.tolerance:.1e} (gradients): {SAFETY:g} × the spread, at least {self.floor:.0e}")


def measure_spread(observe_naive, batches: list[dict], mode: str, groups: dict[str, list[str]]) -> Spread:
    """The spread of ``mode`` (see the module docstring).

    ``observe_naive(batch, mode)`` returns the naive loss's
    :class:`~fusedce_profiler.judgements.doctor.observe.Observation` on ``batch`` under ``mode``.
    """
    floor = tolerance_for("fp32")
    if mode == "fp32":
        return Spread(mode, 0, 0.0, 0.0, floor, floor, {}, floor)
    worst_loss = 0.0
    worst: dict[str, float] = {k: 0.0 for k in groups}
    for batch in batches:
        low, exact = observe_naive(batch, mode), observe_naive(batch, "fp32")
        if low.error is not None or exact.error is not None:
            raise RuntimeError(f"the model's own loss failed: {low.error or exact.error}")
        worst_loss = max(worst_loss, abs(low.loss - exact.loss) / max(abs(exact.loss), 1e-12))
        for label, value in relative_errors(low.grads, exact.grads, groups).items():
            worst[label] = max(worst[label], value)
    gradient = max(worst.values(), default=0.0)
    return Spread(mode, len(batches), worst_loss, gradient, max(floor, SAFETY * gradient), floor, worst,
                  max(floor, SAFETY * worst_loss))
