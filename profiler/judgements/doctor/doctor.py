"""``doctor``: check a loss wrapper on the user's own model against the model's naive loss.

**The contract** (what ``--loss package.module:callable`` names)::

    def my_loss(model, batch) -> torch.Tensor:
        hidden = model.body(batch["input_ids"])           # (B, T, H): what the LM head reads
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # position t predicts labels[t + 1]
        y = batch["labels"][:, 1:].reshape(-1)            # -100 = padding
        return fused_ce(h, model.head.weight, y)          # mean over the labels that are not -100

- ``model``: the model ``doctor`` built (``--preset``/``--config``: the built-in GPT, whose
  ``hidden_states(input_ids)`` is what its ``lm_head`` reads; ``--hf``: a Hugging Face
  ``AutoModelForCausalLM``; ``--model package.module:factory``: yours), in train mode, on the
  doctor's device, fp32 parameters.
- ``batch``: ``{"input_ids": (B, T) int64, "labels": (B, T) int64, "attention_mask": (B, T)}``;
  ``labels`` are the input ids themselves (Hugging Face convention, *not* shifted) with -100
  at padding (rows 1 and 3 are right-padded with token id 0).
- returns: the mean cross-entropy over the predicted positions whose label is not -100, a
  scalar whose graph reaches the model's parameters (``doctor`` calls ``backward()``).
  ``fn(model, input_ids, labels)`` (three arguments) is accepted too.

**The reference** is the model's *own* forward — its head, the head's real bias (or none),
its tie, its final norm and logit transform (soft-cap) — followed by the shifted
cross-entropy: exactly what ``F.cross_entropy(model(ids).logits[:, :-1], labels[:, 1:])``
trains. Both run under the same precision: bf16 autocast with fp32 weights on the GPU
(``amp-bf16``), fp32 on the CPU; values are compared within the mode's parity tolerance
(:mod:`fusedce_profiler.instrument.tolerances`).

**The checks** (:data:`CHECKS`, in order; judged in :mod:`~fusedce_profiler.judgements.doctor.checks`) read
the evidence of :mod:`~fusedce_profiler.judgements.doctor.observe` and :mod:`~fusedce_profiler.judgements.doctor.variants`
— the loss value, every parameter's gradient, the per-position gradient of the body's output,
the head-shaped tensors the loss used — and each names the numbers it judged by. A check whose
premise failed (e.g. the shift cannot be read from the body's gradient when no gradient
reaches the body) is ``not checked`` and says which check it depends on, instead of reporting
a knock-on failure. Verdicts: ``pass``, ``fail``, ``unclear`` (the evidence does not decide),
``not checked``, ``n/a`` (the model has nothing to check there, e.g. no final norm).

Public API: :data:`CHECKS`, :data:`VERDICTS`, :class:`Check`, :class:`DoctorRun`,
:func:`load_wrapper`, :func:`make_batch`, :func:`run_doctor`, :func:`cpu_size_guard`.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.callables import load_callable
from fusedce_profiler.instrument.models.source import BuiltModel, ModelSource
from fusedce_profiler.instrument.tolerances import tolerance_for
from fusedce_profiler.judgements.doctor.checks import JUDGES, Context, check_tie
from fusedce_profiler.judgements.doctor.observe import Landmarks, find_landmarks, observe
from fusedce_profiler.judgements.doctor.variants import loss_variants, reference, untransformed_loss

VERDICTS = ("pass", "fail", "unclear", "not checked", "n/a")

#: (key, item, depends on): every check, in the order they are reported.
CHECKS = (
    ("runs", "the loss runs on a padded batch", ()),
    ("tie", "declared tie honoured by the head's forward", ()),
    ("weight", "the loss multiplies by the parameter the head trains", ("runs",)),
    ("body", "gradient reaches the body", ("runs",)),
    ("norm", "final norm applied", ("runs", "body")),
    ("bias", "bias as the head has it", ("runs",)),
    ("transform", "the model's logit transform (soft-cap) applied", ("runs", "weight")),
    ("shift", "targets shifted (position t predicts labels[t+1])", ("runs", "body")),
    ("ignore", "padding (-100) ignored", ("runs", "weight", "body", "shift")),
    ("reduction", "mean over the labelled tokens (no sum, no extra scaling)",
     ("runs", "weight", "body", "norm", "bias", "transform", "shift", "ignore")),
    ("loss", "loss matches the naive loss", ("runs", "weight", "body", "norm", "bias", "transform", "shift",
                                             "ignore", "reduction")),
    ("gradient", "gradients match the naive loss's", ("runs", "weight", "body", "norm", "bias", "transform",
                                                      "shift", "ignore", "reduction")),
)
_ITEMS = {key: item for key, item, _ in CHECKS}
_DEPENDS = {key: deps for key, _, deps in CHECKS}

#: Largest model ``doctor`` runs on the CPU (fp32, every gradient kept twice).
CPU_MAX_PARAMETERS = 50_000_000


@dataclass
class Check:
    """One doctor item: ``key`` (see :data:`CHECKS`), ``item`` (its sentence), ``verdict``
    (one of :data:`VERDICTS`), ``evidence`` (the numbers), ``depends_on`` (keys)."""

    item: str
    verdict: str
    evidence: str
    key: str = ""
    depends_on: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: object, where: str = "check") -> "Check":
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be an object, got {type(raw).__name__}")
        for name in ("item", "verdict", "evidence"):
            if not isinstance(raw.get(name), str):
                raise ValueError(f"{where}.{name} must be a string, got {raw.get(name)!r}")
        if raw["verdict"] not in VERDICTS:
            raise ValueError(f"{where}.verdict must be one of {', '.join(VERDICTS)}, got {raw['verdict']!r}")
        return cls(raw["item"], raw["verdict"], raw["evidence"], str(raw.get("key", "")),
                   [str(d) for d in raw.get("depends_on") or []])


@dataclass
class DoctorRun:
    """What ``doctor`` stores as ``doctor.json``: the ``--loss`` checked, the model (``config``:
    its name; ``model``: the source), where and how it ran, the located head, the loss values
    (``losses``: yours, the reference and each known mistake's), and the checks in order."""

    loss: str
    config: str
    checks: list[Check]
    model: str = ""
    device: str = "cpu"
    mode: str = "fp32"
    tolerance: float = 0.0
    batch: int = 0
    seq: int = 0
    parameters: int = 0
    head: dict | None = None
    losses: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No item failed (``unclear``, ``not checked`` and ``n/a`` are not failures)."""
        return not any(c.verdict == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> "DoctorRun":
        """Validate a stored run; a bare list of checks is read as a run whose loss and config are unknown."""
        if isinstance(raw, list):
            raw = {"loss": "", "config": "", "checks": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"doctor.json must hold an object, got {type(raw).__name__}")
        checks = raw.get("checks")
        if not isinstance(checks, list):
            raise ValueError(f"checks must be a list, got {checks!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields and k != "checks"}
        for name in ("loss", "config", "model", "device", "mode"):
            if not isinstance(values.get(name, ""), str):
                raise ValueError(f"{name} must be a string, got {values.get(name)!r}")
        return cls(checks=[Check.from_dict(c, f"checks[{i}]") for i, c in enumerate(checks)], **values)


def load_wrapper(spec: str) -> Callable:
    """``"package.module:callable"`` → the loss wrapper; ``ValueError`` naming what is wrong."""
    return load_callable(spec, "--loss")


def as_batch_fn(fn: Callable) -> Callable:
    """``fn(model, batch)``; a three-argument ``fn(model, input_ids, labels)`` is adapted."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        return fn
    if len(params) == 3:
        return lambda model, batch: fn(model, batch["input_ids"], batch["labels"])
    return fn


def cpu_size_guard(parameters: int, name: str) -> str | None:
    """The reason ``doctor`` refuses a model on the CPU (``None`` when it fits)."""
    if parameters <= CPU_MAX_PARAMETERS:
        return None
    return (f"doctor on the CPU runs in fp32 and keeps every gradient twice: {name} has "
            f"{parameters / 1e6:.0f} M parameters, above the CPU limit of {CPU_MAX_PARAMETERS / 1e6:.0f} M "
            f"(≈ {parameters * 4 * 4 / 2**30:.1f} GiB); run it on a GPU (--device cuda) or on a smaller config of the "
            "same model (the wiring does not depend on its size)")


def make_batch(vocab: int, batch: int = 4, seq: int = 32, seed: int = 0, device="cpu", padded: bool = True) -> dict:
    """``{"input_ids", "labels", "attention_mask"}``; with ``padded`` rows 1 and 3 are
    right-padded (token id 0, label -100) from 5/8 and 7/8 of the sequence."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    labels = input_ids.clone()
    mask = torch.ones_like(input_ids)
    if padded:
        for b, length in ((1, seq * 5 // 8), (3, seq * 7 // 8)):
            if b < batch:
                input_ids[b, length:] = 0
                labels[b, length:] = IGNORE_INDEX
                mask[b, length:] = 0
    return {"input_ids": input_ids.to(device), "labels": labels.to(device), "attention_mask": mask.to(device)}


def _randomise(built: BuiltModel, landmarks: Landmarks, seed: int) -> None:
    """Give the head's bias and the final norm non-trivial values, so dropping either is visible."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        bias = built.head.bias
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=gen).to(bias) * 0.5)
        if landmarks.is_norm:
            for name, p in landmarks.producer.named_parameters(recurse=False):
                noise = torch.randn(p.shape, generator=gen).to(p)
                p.copy_((1 + 0.5 * noise) if name == "weight" else 0.1 * noise)


def _finite_loss(observed) -> bool:
    """Whether a call of the loss returned a finite value (it neither raised nor gave NaN/inf)."""
    return observed.error is None and observed.loss is not None and math.isfinite(observed.loss)


def run_doctor(fn: Callable, built: BuiltModel, *, source: ModelSource | None = None, device: str = "cpu",
               mode: str | None = None, batch: int = 4, seq: int = 32, seed: int = 0, spec: str = "") -> DoctorRun:
    """Check ``fn`` (the contract in the module docstring) on ``built`` (already on ``device``).

    ``mode``: ``amp-bf16`` (default on CUDA) or ``fp32`` (default on the CPU). Returns a
    :class:`DoctorRun` with one :class:`Check` per entry of :data:`CHECKS`.
    """
    mode = mode or ("amp-bf16" if str(device).startswith("cuda") else "fp32")
    tolerance = tolerance_for(mode)
    fn = as_batch_fn(fn)
    model = built.module
    model.train()
    torch.manual_seed(seed)
    vocab = built.head.info.vocab
    data = make_batch(vocab, batch, seq, seed, device)
    landmarks = find_landmarks(built, data["input_ids"], mode)
    _randomise(built, landmarks, seed)
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    canonical = {n: p for n, p in model.named_parameters()}  # remove_duplicate: the names grads use
    first_name = {id(p): n for n, p in canonical.items()}
    weight_name = first_name[id(built.head.weight)]
    bias_name = first_name[id(built.head.bias)] if built.head.bias is not None else None
    embedding_name = (first_name.get(id(landmarks.embedding.weight))
                      if landmarks.embedding is not None and hasattr(landmarks.embedding, "weight") else None)
    names = {id(p): [first_name[id(p)]] + [a for a in names[id(p)] if a != first_name[id(p)]] for p in canonical.values()}

    ref, store = reference(built, landmarks, data, mode)
    if ref.error is not None:
        raise RuntimeError(f"the model's own forward failed: {ref.error}")
    user = observe(built, landmarks, fn, data, mode)
    raised = None
    if not _finite_loss(user):  # raised, or NaN (fusedce on CUDA marks out-of-range targets so)
        unpadded = make_batch(vocab, batch, seq, seed, device, padded=False)
        retry = observe(built, landmarks, fn, unpadded, mode)
        if _finite_loss(retry):
            raised = user.error if user.error is not None else f"a loss of {user.loss}"
            data, user = unpadded, retry
            ref, store = reference(built, landmarks, data, mode)
    softcap = getattr(source.config, "final_logit_softcapping", None) if source is not None else None
    softcap = softcap or getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    variants = loss_variants(built, data, store, softcap)
    uncapped = None
    if "on the head's raw output (no transform)" in variants and user.error is None:
        uncapped = observe(built, landmarks, lambda m, b: untransformed_loss(built, b), data, mode)
    context = Context(built, landmarks, ref, user, data, tolerance, names, weight_name, bias_name, embedding_name,
                       variants, raised, uncapped)
    tie = check_tie(built, source, names)
    results: dict[str, tuple[str, str]] = {"tie": tie}
    if user.error is not None:
        results["runs"] = ("fail", f"calling it on the padded batch raised {user.error}")
    elif not math.isfinite(user.loss):
        results["runs"] = ("fail", f"it returned {user.loss} on the padded batch")
    elif not user.requires_grad:
        results["runs"] = ("fail", "it returned a loss without a graph (requires_grad is False): computed under "
                                   "torch.no_grad() or from detached tensors, nothing would train")
    else:
        results["runs"] = ("pass", f"returned {user.loss:.6g} (the naive loss: {ref.loss:.6g})"
                           + (" — only on a batch without padding" if raised else ""))
    checks: list[Check] = []
    for key, item, deps in CHECKS:
        if key not in results:
            blocked = [d for d in deps if results.get(d, ("",))[0] in ("fail", "not checked")]
            if blocked:
                results[key] = ("not checked", f"depends on “{_ITEMS[blocked[0]]}”, which "
                                + ("failed" if results[blocked[0]][0] == "fail" else "was not checked"))
            else:
                results[key] = JUDGES[key](context)
        verdict, evidence = results[key]
        checks.append(Check(item, verdict, evidence, key, list(deps)))
    losses = {"yours": user.loss, "naive (reference)": ref.loss}
    losses.update({f"naive, {name}": value for name, value in context.variants.items()})
    description = source.describe() if source is not None else type(model).__name__
    return DoctorRun(loss=spec, config=(source.config.name if source is not None else type(model).__name__),
                     checks=checks, model=description, device=str(device), mode=mode, tolerance=tolerance,
                     batch=batch, seq=seq, parameters=sum(p.numel() for p in canonical.values()),
                     head=dataclasses.asdict(built.head.info), losses=losses)
