"""The judges of ``doctor``: one function per entry of :data:`~fusedce_profiler.judgements.doctor.doctor.CHECKS`.

Each judge reads a :class:`Context` — the evidence :mod:`~fusedce_profiler.judgements.doctor.observe`
observed of the user's loss and of the reference, plus the naive loss's values with each known
mistake (:mod:`~fusedce_profiler.judgements.doctor.variants`) — and returns ``(verdict, evidence)``: one
of :data:`~fusedce_profiler.judgements.doctor.doctor.VERDICTS` and the numbers it judged by.

Public API: :class:`Context`, :func:`check_tie`, :func:`body_names`, :func:`norm`, :func:`close`, :data:`JUDGES`
(key → judge of a :class:`Context`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.models.head import input_embedding, stray_weight, stray_weight_finding
from fusedce_profiler.instrument.models.source import BuiltModel, ModelSource
from fusedce_profiler.judgements.doctor.loss_options import LossOptions
from fusedce_profiler.judgements.doctor.observe import Landmarks, Observation
from fusedce_profiler.judgements.doctor.precision import gradient_groups, relative_errors

_ZERO = 1e-6  # a per-position gradient below this fraction of the largest one counts as none
_STARVED = 1e-3  # a position gets no gradient from the loss when it gets below this fraction of the naive loss's


def norm(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(t.double().norm())


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if b is None:
        return 0.0 if a is None or norm(a) == 0 else math.inf
    nb = norm(b)
    if a is None:
        return 1.0 if nb > 0 else 0.0
    return float((a.double() - b.double()).norm() / nb) if nb > 0 else norm(a)


def _cos(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None or norm(a) == 0 or norm(b) == 0:
        return 0.0
    return float((a.double() * b.double()).sum() / (a.double().norm() * b.double().norm()))


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


@dataclass
class Context:
    """What every judge reads: the model and its landmarks, the reference's and the user's
    :class:`~fusedce_profiler.judgements.doctor.observe.Observation`, the batch, the mode's tolerance, every
    parameter's names (``id`` → canonical name first), the head's parameter names and the
    naive loss's variants (name → value)."""

    built: BuiltModel
    landmarks: Landmarks
    ref: Observation
    user: Observation
    batch: dict
    tolerance: float  # for gradients (relative norm of the difference)
    names: dict[int, list[str]]
    weight_name: str
    bias_name: str | None
    embedding_name: str | None
    variants: dict[str, float]
    raised_on_padding: str | None = None
    uncapped: Observation | None = None  # the naive loss on the head's raw output, when the model transforms it
    fn: Callable | None = None  # the user's loss, fn(model, batch, **keywords)
    keywords: frozenset = frozenset()  # the optional keywords it takes (num_items_in_batch, reduction)
    mode: str = "fp32"
    options: LossOptions = field(default_factory=LossOptions)
    store: dict = field(default_factory=dict)  # what the reference saw: logits, raw, head_input, prenorm
    compile_backend: str | None = None
    loss_tolerance: float = 0.0  # for loss values (relative difference); 0: the gradients' tolerance
    group_tolerances: dict = field(default_factory=dict)  # gradient group → its own tolerance

    def __post_init__(self) -> None:
        self.loss_tolerance = self.loss_tolerance or self.tolerance

    def name_of(self, param) -> str:
        return self.names[id(param)][0]


def body_names(c: Context) -> list[str]:
    skip = {c.weight_name, c.bias_name, c.embedding_name}
    if c.landmarks.is_norm:  # the final norm is judged by its own check
        skip |= {f"{c.landmarks.producer_name}.{n}" for n, _ in c.landmarks.producer.named_parameters(recurse=False)}
    return [n for n, g in c.ref.grads.items() if n not in skip and g is not None and norm(g) > 0]


def check_tie(built: BuiltModel, source: ModelSource | None, names) -> tuple[str, str]:
    info = built.head.info
    weight = built.head.weight
    stray = stray_weight(built.module, info.path, weight)
    embedding = input_embedding(built.module)
    used = names[id(weight)][0]
    if stray is not None:
        owner, assigned = stray
        alias = names.get(id(assigned), [f"{owner}.weight"])[0]
        return "fail", stray_weight_finding(owner, alias, used, embedding is not None and assigned is embedding)
    declared = getattr(source.config, "tie_word_embeddings", False) if source is not None else False
    if source is not None and source.kind == "user":
        declared = False  # a factory's config is inferred from the model itself
    if declared and not info.tied:
        return "fail", (f"the config ties the head to the input embedding, but the head's forward multiplies by {used}, "
                        "which is not the embedding")
    if info.tied:
        return "pass", f"the head's forward multiplies by {used}, the input embedding itself (tied)"
    return "pass", f"untied, as declared: the head's forward multiplies by its own {used}"


def _check_weight(c: Context) -> tuple[str, str]:
    g_user, g_ref = c.user.grad(c.weight_name), c.ref.grad(c.weight_name)
    ref_norm = norm(g_ref)
    if norm(g_user) > 1e-3 * ref_norm:
        return "pass", (f"your loss's gradient reaches {c.weight_name} (‖grad‖ {norm(g_user):.3g}, the naive loss's "
                        f"{ref_norm:.3g}, cosine {_cos(g_user, g_ref):.4f})")
    evidence = [f"{c.weight_name} — the (V, H) parameter the head's forward multiplies by, and the one the optimizer "
                f"trains — gets no gradient from your loss (the naive loss gives it ‖grad‖ {ref_norm:.3g})"]
    v, h = c.built.head.weight.shape
    extra = [n for n, g in c.user.grads.items() if g is not None and norm(g) > 0 and g.dim() == 2
             and tuple(g.shape) in ((v, h), (h, v)) and norm(c.ref.grad(n)) == 0]
    if extra:
        evidence.append(f"its gradient went to {', '.join(extra)} instead (a parameter the naive loss does not train "
                        "through the head)")
    for t in c.user.seen:
        if t.equals_weight:
            evidence.append(f"your loss multiplied by a {t.shape} {t.dtype} tensor outside the graph holding the same "
                            f"values as {c.weight_name}: a detached copy")
        else:
            evidence.append(f"your loss multiplied by a {t.shape} {t.dtype} tensor outside the graph that differs from "
                            f"{c.weight_name} (max |Δ| {t.max_abs_diff:.3g}): a stale copy or another weight")
    return "fail", "; ".join(evidence)


def _check_body(c: Context) -> tuple[str, str]:
    body = body_names(c)
    if not body:
        return "n/a", "the naive loss trains no parameter besides the head and the embedding"
    reached = [n for n in body if norm(c.user.grad(n)) > 0]
    user_norm = math.sqrt(sum(norm(c.user.grad(n)) ** 2 for n in body))
    ref_norm = math.sqrt(sum(norm(c.ref.grad(n)) ** 2 for n in body))
    if not reached:
        return "fail", (f"none of the {len(body)} body parameters the naive loss trains (e.g. {body[0]}) gets a "
                        f"gradient from your loss (‖grad‖ 0, the naive loss's {ref_norm:.3g}): the hidden states "
                        "reached it detached (.detach(), .data, torch.no_grad); the body never trains")
    if len(reached) < len(body):
        missing = [n for n in body if n not in reached]
        return "fail", (f"{len(missing)} of {len(body)} body parameters get no gradient from your loss (e.g. "
                        f"{', '.join(missing[:3])}): part of the body is detached")
    return "pass", (f"all {len(body)} body parameters get a gradient (‖grad‖ {user_norm:.3g}, the naive loss's "
                    f"{ref_norm:.3g})")


def _check_norm(c: Context) -> tuple[str, str]:
    lm = c.landmarks
    if not lm.is_norm:
        what = f"{lm.producer_name} ({type(lm.producer).__name__})" if lm.producer is not None else "a function"
        return "n/a", f"no final norm between the body and the head (the head's input comes from {what})"
    params = [f"{lm.producer_name}.{n}" for n, _ in lm.producer.named_parameters(recurse=False)]
    params = [p for p in params if norm(c.ref.grad(p)) > 0]
    no_norm = c.variants.get("without the final norm")
    value = (f"; your loss {_fmt(c.user.loss)}, the naive loss {_fmt(c.ref.loss)}, without the norm {_fmt(no_norm)}"
             if no_norm is not None else "")
    if not params:
        if no_norm is not None and c.user.loss is not None and close(c.user.loss, no_norm, c.loss_tolerance) \
                and not close(c.user.loss, c.ref.loss, c.loss_tolerance):
            return "fail", f"your loss equals the naive loss computed without {lm.producer_name}{value}"
        return "pass", f"{lm.producer_name} has no trainable parameters to check by gradient{value}"
    missing = [p for p in params if norm(c.user.grad(p)) == 0]
    if missing:
        return "fail", (f"{lm.producer_name} ({type(lm.producer).__name__}) gets no gradient from your loss "
                        f"({', '.join(missing)}): the loss reads the hidden states before the final norm{value}")
    return "pass", f"{lm.producer_name} ({type(lm.producer).__name__}) gets its gradient{value}"


def _check_bias(c: Context) -> tuple[str, str]:
    v = c.built.head.weight.shape[0]
    if c.bias_name is not None:
        no_bias = c.variants.get("without the head's bias")
        g_user, g_ref = c.user.grad(c.bias_name), c.ref.grad(c.bias_name)
        if norm(g_user) == 0:
            return "fail", (f"the head adds {c.bias_name}, but your loss does not: its gradient is zero (your loss "
                            f"{_fmt(c.user.loss)}, the naive loss {_fmt(c.ref.loss)}, the naive loss without the bias "
                            f"{_fmt(no_bias)})")
        return "pass", f"{c.bias_name} gets its gradient (cosine with the naive loss's {_cos(g_user, g_ref):.4f})"
    extra = [n for n, g in c.user.grads.items() if g is not None and g.dim() == 1 and g.shape[0] == v
             and norm(g) > 0 and norm(c.ref.grad(n)) == 0]
    if extra:
        return "fail", (f"the head has no bias, but your loss adds {', '.join(extra)} ({v},): a parameter the model's "
                        "own forward never uses gets trained")
    return "pass", "the head has no bias and your loss adds none that is a parameter"


def close(a: float | None, b: float | None, tol: float) -> bool:
    return a is not None and b is not None and abs(a - b) <= tol * max(abs(b), 1e-12)


def _check_transform(c: Context) -> tuple[str, str]:
    raw = c.variants.get("on the head's raw output (no transform)")
    if raw is None:
        return "n/a", "the model's logits are the head's output (no soft-cap or scaling)"
    values = f"your loss {_fmt(c.user.loss)}; naive {_fmt(c.ref.loss)}; without the transform {_fmt(raw)}"
    if c.uncapped is not None and c.uncapped.loss is not None:
        to_ref = _rel(c.user.grad(c.weight_name), c.ref.grad(c.weight_name))
        to_raw = _rel(c.user.grad(c.weight_name), c.uncapped.grad(c.weight_name))
        grads = (f"; ‖Δ grad {c.weight_name}‖ relative to the naive loss's {to_ref:.2e}, to the untransformed "
                 f"loss's {to_raw:.2e}")
        if to_raw <= c.tolerance < to_ref:
            return "fail", ("your loss trains the head's raw output: its gradient is the one of the cross-entropy "
                            "without the model's logit transform (soft-cap), not the model's own — " + values + grads)
        return "pass", values + grads
    if close(c.user.loss, raw, c.loss_tolerance / 4) and not close(c.user.loss, c.ref.loss, c.loss_tolerance / 4):
        return "fail", (f"your loss {_fmt(c.user.loss)} equals the cross-entropy of the head's raw output ({_fmt(raw)}); "
                        f"the model's forward transforms it (soft-cap) before its loss ({_fmt(c.ref.loss)})")
    return "pass", values


def _rows(grad: torch.Tensor) -> torch.Tensor:
    rows = grad.double().norm(dim=-1)  # (B, T)
    return rows / (float(rows.max()) or 1.0)


def _check_shift(c: Context) -> tuple[str, str]:
    if c.user.body_grad is None or c.ref.body_grad is None:
        return "unclear", "the body's output received no gradient to read the positions from"
    rows, ref_rows = _rows(c.user.body_grad), _rows(c.ref.body_grad)
    seq = rows.shape[1]
    full = [b for b in range(rows.shape[0]) if bool((c.batch["labels"][b] != IGNORE_INDEX).all())]
    last = max((float(rows[b, seq - 1]) for b in full), default=0.0)
    # Position t's gradient relative to the naive loss's at the same position: a position the
    # model itself barely trains (a tiny gradient through its norm) is no evidence.
    starved = (rows < _STARVED * ref_rows) & (ref_rows > 0)
    first = min(float(rows[b, 0]) for b in range(rows.shape[0]))
    unshifted = c.variants.get("targets not shifted")
    values = f" (your loss {_fmt(c.user.loss)}; naive {_fmt(c.ref.loss)}; with unshifted targets {_fmt(unshifted)})"
    # Full rows: the naive loss trains positions 0 .. T-2; a shift by k leaves the last k untrained,
    # T-2 among them in every full row. Untrained positions elsewhere are ignored labels ("ignore").
    untrained = sorted({t for b in full for t in range(seq - 1) if bool(starved[b, t]) and float(ref_rows[b, t]) >= _ZERO})
    tail_untrained = bool(full) and all(bool(starved[b, seq - 2]) for b in full)
    # A value equal to a variant's names it only when no other known mistake's value is closer: near
    # a uniform prediction every variant's value is ≈ ln V, and one can sit near another by chance.
    closest = min(c.variants, key=lambda n: abs(c.variants[n] - c.user.loss), default=None)
    for name, what in (("targets not shifted", "the labels are not shifted (position t trained on labels[t])"),
                       ("targets shifted twice", "the targets are shifted twice (position t trained on labels[t+2])")):
        value = c.variants.get(name)
        if name == closest and close(c.user.loss, value, c.loss_tolerance / 4) \
                and not close(value, c.ref.loss, c.loss_tolerance):
            return "fail", f"your loss equals the naive loss with {name}: {what}" + values
    if last >= _ZERO:
        return "fail", (f"the last position of full rows gets gradient {last:.2e} of the largest, where the naive loss "
                        f"gives {max((float(ref_rows[b, seq - 1]) for b in full), default=0.0):.1e}: it is trained on a "
                        "target it has no next token for — labels not shifted" + values)
    if bool(starved[:, 0].all()):
        return "fail", (f"the first position gets no gradient ({first:.1e} of the largest; the naive loss gives it "
                        f"{min(float(ref_rows[b, 0]) for b in range(rows.shape[0])):.1e}): the targets are shifted the wrong way "
                        "(hidden[:, 1:] against labels[:, :-1])" + values)
    if untrained and tail_untrained:
        twice = c.variants.get("targets shifted twice")
        return "fail", (f"positions {', '.join(map(str, untrained[:4]))}{' …' if len(untrained) > 4 else ''} of full "
                        f"rows get no gradient, where the naive loss trains every position but the last: the targets "
                        f"are shifted by more than one (your loss {_fmt(c.user.loss)}; naive {_fmt(c.ref.loss)}; "
                        f"shifted twice {_fmt(twice)})")
    return "pass", f"the last position gets none ({last:.1e}) and the first does ({first:.1e}), as with the naive loss"


def _check_ignore(c: Context) -> tuple[str, str]:
    if c.raised_on_padding is not None:
        return "fail", (f"your loss failed on labels holding -100 ({c.raised_on_padding}) and runs when the padding is "
                        "labelled 0: it does not ignore -100 (a different ignore_index?); the other checks ran on a "
                        "batch without padding")
    if c.user.body_grad is None or c.ref.body_grad is None:
        return "unclear", "the body's output received no gradient to read the positions from"
    labels = c.batch["labels"]
    rows, ref_rows = _rows(c.user.body_grad), _rows(c.ref.body_grad)
    predicts_pad = torch.zeros_like(labels, dtype=torch.bool)
    predicts_pad[:, :-1] = labels[:, 1:] == IGNORE_INDEX
    if not bool(predicts_pad.any()):
        return "n/a", "the batch has no padding"
    worst = float(rows[predicts_pad].max())
    trained = c.variants.get("padding trained as token 0")
    if worst >= _ZERO:
        return "fail", (f"positions whose label is -100 get gradient up to {worst:.2e} of the largest (the naive loss: "
                        f"{float(ref_rows[predicts_pad].max()):.1e}): padding is trained on — ignore_index not -100, or "
                        f"the -100 labels replaced (your loss {_fmt(c.user.loss)}; naive {_fmt(c.ref.loss)}; "
                        f"padding trained as token 0 {_fmt(trained)})")
    real = (~predicts_pad)
    real[:, -1] = False
    dropped = real & (rows < _STARVED * ref_rows) & (ref_rows >= _ZERO)
    if bool(dropped.any()):
        ids = sorted({int(i) for i in labels[:, 1:][dropped[:, :-1]]})
        return "fail", (f"{int(dropped.sum())} labelled positions get no gradient, where the naive loss trains them: "
                        f"real tokens are ignored (their labels: token ids {', '.join(map(str, ids[:6]))}; an "
                        "ignore_index equal to a real token id?)")
    return "pass", f"positions whose label is -100 get no gradient ({worst:.1e}); every labelled one does"


_SCALES = (("a sum over the labelled tokens", "tokens"), ("the mean divided by k", "1/k"),
           ("the mean times k", "k"), ("a mean over every position, padding included", "all"))


def _check_reduction(c: Context) -> tuple[str, str]:
    tol = c.loss_tolerance
    g_user, g_ref = c.user.grad(c.weight_name), c.ref.grad(c.weight_name)
    ratio_loss = c.user.loss / c.ref.loss if c.ref.loss else math.nan
    ratio_grad = norm(g_user) / norm(g_ref) if norm(g_ref) else math.nan
    cos = _cos(g_user, g_ref)
    evidence = (f"your loss / naive = {ratio_loss:.4g}, ‖grad {c.weight_name}‖ / naive = {ratio_grad:.4g} "
                f"(cosine {cos:.4f})")
    if abs(ratio_loss - 1) <= tol:
        return "pass", evidence + ": the mean over the labelled tokens"
    labelled = int((c.batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    positions = c.batch["labels"][:, 1:].numel()
    seq_mean = c.variants.get("mean of per-sequence means")
    candidates = [("a sum over the labelled tokens (reduction='sum')", float(labelled)),
                  ("a mean over every position, padding included (divided by B·(T−1), not by the labelled count)",
                   labelled / positions)]
    candidates += [(f"the mean divided by {k} (gradient-accumulation scaling inside the loss: the trainer already "
                    f"divides by the accumulation steps)", 1.0 / k) for k in range(2, 65)]
    candidates += [(f"the mean times {k}", float(k)) for k in range(2, 65)]
    for name, scale in candidates:
        if abs(ratio_loss / scale - 1) <= tol:
            return "fail", evidence + f": your loss is {name}"
    if seq_mean is not None and close(c.user.loss, seq_mean, tol):
        return "fail", evidence + f": your loss equals the mean of per-sequence means ({seq_mean:.6g})"
    return "unclear", evidence + ": neither the mean nor a known reduction or scaling"


def _check_loss(c: Context) -> tuple[str, str]:
    rel = abs(c.user.loss - c.ref.loss) / max(abs(c.ref.loss), 1e-12)
    verdict = "pass" if rel <= c.loss_tolerance else "fail"
    match = [name for name, value in c.variants.items() if close(c.user.loss, value, c.loss_tolerance)
             and not close(value, c.ref.loss, c.loss_tolerance)]
    return verdict, (f"your loss {c.user.loss:.6g}, the naive loss {c.ref.loss:.6g}: relative difference {rel:.2e} "
                     f"(tolerance {c.loss_tolerance:.0e})" + (f"; it equals the naive loss {match[0]}" if match else ""))


def _check_gradient(c: Context) -> tuple[str, str]:
    errors = relative_errors(c.user.grads, c.ref.grads, gradient_groups(c.weight_name, c.bias_name, body_names(c)))
    limits = {k: c.group_tolerances.get(k, c.tolerance) for k in errors}
    failed = [k for k in errors if errors[k] > limits[k]]
    listed = ", ".join(f"{k} {v:.2e} (tolerance {limits[k]:.1e})" for k, v in errors.items())
    return ("fail" if failed else "pass"), (f"relative error vs the naive loss's gradients: {listed}; each tolerance "
                                            f"from the spread {c.mode} puts on the model's own gradient there")


#: key → judge: every check of :data:`~fusedce_profiler.judgements.doctor.doctor.CHECKS` but ``runs`` and ``tie``
#: (``run_doctor`` judges those before the context exists).
JUDGES = {"weight": _check_weight, "body": _check_body, "norm": _check_norm, "bias": _check_bias,
          "transform": _check_transform, "shift": _check_shift, "ignore": _check_ignore,
          "reduction": _check_reduction, "loss": _check_loss, "gradient": _check_gradient}
