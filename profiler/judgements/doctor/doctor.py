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
cross-entropy with the config's options (:mod:`~fusedce_profiler.judgements.doctor.loss_options`):
what ``F.cross_entropy(model(ids).logits[:, :-1], labels[:, 1:])`` trains. Both run under the
user's precision — ``amp-bf16`` (bf16 autocast with fp32 weights, on the GPU or the CPU) or
``fp32`` — and are compared within tolerances measured for it on the model's own loss
(:mod:`~fusedce_profiler.judgements.doctor.precision`).

**The checks** (:data:`CHECKS`, in order; judged in :mod:`~fusedce_profiler.judgements.doctor.checks`,
:mod:`~fusedce_profiler.judgements.doctor.probes` and :mod:`~fusedce_profiler.judgements.doctor.inspections`) read
the evidence of :mod:`~fusedce_profiler.judgements.doctor.observe` and :mod:`~fusedce_profiler.judgements.doctor.variants`
— the loss value, every parameter's gradient, the per-position gradient of the body's output,
the head-shaped tensors the loss used — and each names the numbers it judged by. A check whose
premise failed (e.g. the shift cannot be read from the body's gradient when no gradient
reaches the body) is ``not checked`` and says which check it depends on, instead of reporting
a knock-on failure. Verdicts: ``pass``, ``fail``, ``unclear`` (the evidence does not decide),
``not checked``, ``n/a`` (the model has nothing to check there, e.g. no final norm).

Public API: :data:`CHECKS`, :data:`VERDICTS`, :class:`Check`, :class:`DoctorRun` (from
:mod:`~fusedce_profiler.judgements.doctor.records`), :data:`KEYWORDS`, :func:`signature_of`,
:func:`signature_error`, :func:`load_wrapper`, :func:`make_batch`, :func:`run_doctor`, :func:`cpu_size_guard`.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.callables import load_callable, what_it_raised
from fusedce_profiler.instrument.models.source import BuiltModel, ModelSource
from fusedce_profiler.instrument.tolerances import tolerance_for
from fusedce_profiler.judgements.doctor.checks import JUDGES, Context, body_names, check_tie
from fusedce_profiler.judgements.doctor.inspections import JUDGES as INSPECTIONS
from fusedce_profiler.judgements.doctor.loss_options import options_of
from fusedce_profiler.judgements.doctor.precision import Spread, gradient_groups, measure_spread
from fusedce_profiler.judgements.doctor.probes import JUDGES as PROBES
from fusedce_profiler.judgements.doctor.records import CHECKS, ITEMS, VERDICTS, Check, DoctorRun
from fusedce_profiler.judgements.doctor.observe import Landmarks, find_landmarks, naive_loss, observe
from fusedce_profiler.judgements.doctor.variants import loss_variants, reference, untransformed_loss

#: Largest model ``doctor`` runs on the CPU (fp32, every gradient kept twice).
CPU_MAX_PARAMETERS = 50_000_000


def load_wrapper(spec: str) -> Callable:
    """``"package.module:callable"`` → the loss wrapper; ``ValueError`` naming what is wrong."""
    return load_callable(spec, "--loss")


#: Optional keywords the doctor passes to a loss that takes them.
KEYWORDS = ("num_items_in_batch", "reduction")


def signature_of(fn: Callable) -> tuple[int, frozenset]:
    """(required positional parameters, which of :data:`KEYWORDS` it takes — all of them with
    ``**kwargs``); ``(2, {})`` when the signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2, frozenset()
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return len(required), frozenset(KEYWORDS)
    return len(required), frozenset(p.name for p in params if p.name in KEYWORDS and p.kind != p.POSITIONAL_ONLY)


def signature_error(fn: Callable, name: str) -> str | None:
    """Why ``fn`` cannot be called as ``fn(model, batch)`` or ``fn(model, input_ids, labels)``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    kw_required = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if kw_required or len(required) > 3 or len(positional) < 2:
        return (f"{name} must be callable as fn(model, batch) or fn(model, input_ids, labels), got "
                f"{getattr(fn, '__name__', fn)}{inspect.signature(fn)}")
    return None


def as_batch_fn(fn: Callable) -> Callable:
    """``fn(model, batch, **keywords)``; a three-argument ``fn(model, input_ids, labels)`` is adapted."""
    if signature_of(fn)[0] == 3:
        return lambda model, batch, **kw: fn(model, batch["input_ids"], batch["labels"], **kw)
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
    right-padded (token id 0, label -100) from 5/8 and 7/8 of the sequence.

    Every row also holds the first and the last token ids (0 and V − 1, often a tokenizer's pad
    or special id) as real, labelled tokens at 1/4 and 3/8 of the sequence: a loss whose
    ``ignore_index`` equals one of them drops real tokens, which shows only when they are labelled.
    """
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    input_ids[:, seq // 4] = 0
    input_ids[:, seq * 3 // 8] = vocab - 1
    labels = input_ids.clone()
    mask = torch.ones_like(input_ids)
    if padded:
        for b, length in ((1, seq * 5 // 8), (3, seq * 7 // 8)):
            if b < batch:
                input_ids[b, length:] = 0
                labels[b, length:] = IGNORE_INDEX
                mask[b, length:] = 0
    return {"input_ids": input_ids.to(device), "labels": labels.to(device), "attention_mask": mask.to(device)}


def _assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """``param.copy_(value)``; a sharded (DTensor) parameter takes its shard of ``value`` (every
    rank computes the same ``value`` from the same seed)."""
    if type(param).__name__ == "DTensor":
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(param.dtype), param.device_mesh, param.placements)
    param.copy_(value)


def _randomise(built: BuiltModel, landmarks: Landmarks, seed: int) -> None:
    """Give the head's bias and the final norm non-trivial values, so dropping either is visible."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        bias = built.head.bias
        if bias is not None:
            _assign(bias, torch.randn(tuple(bias.shape), generator=gen).to(bias.device) * 0.5)
        if landmarks.is_norm:
            for name, p in landmarks.producer.named_parameters(recurse=False):
                noise = torch.randn(tuple(p.shape), generator=gen).to(p.device)
                _assign(p, (1 + 0.5 * noise) if name == "weight" else 0.1 * noise)


def _finite_loss(observed) -> bool:
    """Whether a call of the loss returned a finite value (it neither raised nor gave NaN/inf)."""
    return observed.error is None and observed.loss is not None and math.isfinite(observed.loss)


def _judge_all(context: Context, results: dict[str, tuple[str, str]]) -> list[Check]:
    """Every check of :data:`CHECKS` in order; one whose premise failed is ``not checked``."""
    judges = {**JUDGES, **PROBES, **INSPECTIONS}
    checks: list[Check] = []
    for key, item, deps in CHECKS:
        if key not in results:
            blocked = [d for d in deps if results.get(d, ("",))[0] in ("fail", "not checked")]
            if blocked:
                results[key] = ("not checked", f"depends on “{ITEMS[blocked[0]]}”, which "
                                + ("failed" if results[blocked[0]][0] == "fail" else "was not checked"))
            else:
                try:
                    results[key] = judges[key](context)
                except Exception as exc:  # noqa: BLE001 - one check that cannot run does not end the others
                    results[key] = ("unclear", f"the check could not run on this model: {what_it_raised(exc)}")
        verdict, evidence = results[key]
        checks.append(Check(item, verdict, evidence, key, list(deps)))
    return checks


def _runs(user, ref, raised) -> tuple[str, str]:
    if user.error is not None:
        return "fail", f"calling it on the padded batch raised {user.error}"
    if not math.isfinite(user.loss):
        return "fail", f"it returned {user.loss} on the padded batch"
    if not user.requires_grad:
        return "fail", ("it returned a loss without a graph (requires_grad is False): computed under "
                        "torch.no_grad() or from detached tensors, nothing would train")
    return "pass", (f"returned {user.loss:.6g} (the naive loss: {ref.loss:.6g})"
                    + (" — only on a batch without padding" if raised else ""))


def run_doctor(fn: Callable, built: BuiltModel, *, source: ModelSource | None = None, device: str = "cpu",
               mode: str | None = None, batch: int = 4, seq: int = 32, seed: int = 0, spec: str = "",
               compile_backend: str | None = None, spread_samples: int = 2) -> DoctorRun:
    """Check ``fn`` (the contract in the module docstring) on ``built`` (already on ``device``).

    ``mode``: ``amp-bf16`` (bf16 autocast, on CUDA and on the CPU; default on CUDA) or ``fp32``
    (default on the CPU); the tolerance is measured for it (:mod:`~fusedce_profiler.judgements.doctor.precision`)
    over ``spread_samples`` batches. ``compile_backend``: the ``torch.compile`` back-end the
    ``compile`` check uses (``None``: not checked). On a sharded model in an initialised process
    group the checks run on this rank. Returns a :class:`DoctorRun` with one :class:`Check` per
    entry of :data:`CHECKS`.
    """
    mode = mode or ("amp-bf16" if str(device).startswith("cuda") else "fp32")
    keywords = signature_of(fn)[1]
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
    options = options_of(source.config if source is not None else None, getattr(model, "config", None))

    ref, store = reference(built, landmarks, data, mode, options)
    if ref.error is not None:
        raise RuntimeError(f"the model's own forward failed: {ref.error}")
    user = observe(built, landmarks, fn, data, mode)
    raised = None
    if not _finite_loss(user):  # raised, or NaN (fusedce on CUDA marks out-of-range targets so)
        unpadded = make_batch(vocab, batch, seq, seed, device, padded=False)
        retry = observe(built, landmarks, fn, unpadded, mode)
        if _finite_loss(retry):
            raised = user.error if user.error is not None else f"a loss of {user.loss}"
            retry.site = user.site
            data, user = unpadded, retry
            ref, store = reference(built, landmarks, data, mode, options)
    softcap = getattr(source.config, "final_logit_softcapping", None) if source is not None else None
    softcap = softcap or getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    variants = loss_variants(built, data, store, softcap, options)
    uncapped = None
    if "on the head's raw output (no transform)" in variants and user.error is None:
        uncapped = observe(built, landmarks, lambda m, b: untransformed_loss(built, b), data, mode)
    context = Context(built, landmarks, ref, user, data, tolerance_for("fp32"), names, weight_name, bias_name,
                      embedding_name, variants, raised, uncapped, fn=fn, keywords=keywords, mode=mode,
                      options=options, store=store, compile_backend=compile_backend)
    spread = measure_spread(
        lambda b, m: observe(built, landmarks, lambda mod, bb: naive_loss(built, bb, None, options), b, m),
        [make_batch(vocab, batch, seq, seed + 100 + i, device) for i in range(spread_samples)], mode,
        gradient_groups(weight_name, bias_name, body_names(context)))
    context.tolerance, context.loss_tolerance = spread.tolerance, spread.loss_tolerance
    context.group_tolerances = spread.group_tolerances()
    results: dict[str, tuple[str, str]] = {"tie": check_tie(built, source, names), "runs": _runs(user, ref, raised)}
    checks = _judge_all(context, results)
    losses = {"yours": user.loss, "naive (reference)": ref.loss}
    losses.update({f"naive, {name}": value for name, value in context.variants.items()})
    description = source.describe() if source is not None else type(model).__name__
    rank, world = _rank()
    return DoctorRun(loss=spec, config=(source.config.name if source is not None else type(model).__name__),
                     checks=checks, model=description, device=str(device), mode=mode, tolerance=spread.tolerance,
                     batch=batch, seq=seq, parameters=sum(p.numel() for p in canonical.values()),
                     head=dataclasses.asdict(built.head.info), losses=losses, spread=dataclasses.asdict(spread),
                     options=options.active(), rank=rank, world_size=world)


def _rank() -> tuple[int, int]:
    """(rank, world size) of the initialised process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
