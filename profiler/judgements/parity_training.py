"""Running a parity comparison: each curve trained — a fresh model from the same initialisation
(perturbed by one rounding for the control), AdamW on the Markov chain's batches, the loss and the
gradient checks of each step — then judged against torch's
(:mod:`fusedce_profiler.judgements.parity` defines the records and the judgement).

Public API: :func:`run_parity`, :class:`ReferenceFailed`, :func:`train_curve`, :func:`build_model`,
:func:`perturb_`, and the worker's side: :func:`run_curve_job` (the ``parity-curve`` job), :func:`warm_up_training`.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import torch_loss
from fusedce_profiler.instrument.callables import message_of, what_it_raised
from fusedce_profiler.instrument.models.gpt import HiddenStatesGPT as GPT
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.instrument.reference import relative_error
from fusedce_profiler.instrument.schema import build
from fusedce_profiler.instrument.step.data import MarkovChain
from fusedce_profiler.instrument.step.losses import BackendUnavailable, resolve_backend
from fusedce_profiler.judgements.parity import (CONTROL, LEARN_FRACTION, REFERENCE, GradCheck, ParityCurve,
                                                ParityReport, ParitySettings, judge)


def build_model(settings: ParitySettings) -> GPT:
    """The model every back-end starts from (same seed → same weights; bias random if any)."""
    with torch.device(settings.device):
        model = GPT(settings.config, seed=settings.seed)
    if model.lm_head_bias is not None:
        gen = torch.Generator(device=settings.device).manual_seed(settings.seed + 1)
        with torch.no_grad():
            model.lm_head_bias.copy_(torch.randn(model.lm_head_bias.shape, generator=gen,
                                                 device=settings.device) * 0.5)
    return model


def _loss_and_grads(model: GPT, loss_fn, options: LossOptions, inputs, targets, mode: str):
    """Zero the gradients, forward + backward once; return (loss, copies of the LM-head
    weight, bias and hidden-state gradients). The parameters keep their ``.grad``."""
    model.zero_grad(set_to_none=True)
    captured: dict[str, torch.Tensor] = {}
    with autocast(mode, inputs.device):
        hidden = model(inputs)
        hidden.register_hook(lambda g: captured.__setitem__("hidden", g.detach().clone()))
        loss = loss_fn(hidden.reshape(-1, hidden.shape[-1]), model.lm_head_weight, targets.reshape(-1),
                       model.lm_head_bias, options)
    loss.backward()
    weight_grad = model.lm_head_weight.grad
    grads = {"lm_head": weight_grad.detach().clone() if weight_grad is not None
             else torch.zeros_like(model.lm_head_weight),
             "hidden": captured.get("hidden", torch.zeros_like(hidden))}
    if model.lm_head_bias is not None:
        bias_grad = model.lm_head_bias.grad
        grads["bias"] = bias_grad.detach().clone() if bias_grad is not None else torch.zeros_like(model.lm_head_bias)
    return loss.detach(), grads


def perturb_(model: GPT, settings: ParitySettings) -> None:
    """In place: every parameter p ← p·(1 + u·z), u the mode's unit roundoff, z ~ N(0, 1)."""
    unit = torch.finfo(torch.bfloat16 if settings.mode == "amp-bf16" else torch.float32).eps / 2
    gen = torch.Generator(device="cpu").manual_seed(settings.seed + 7)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=gen).to(param.device, param.dtype)
            param.mul_(1 + unit * noise)


def train_curve(settings: ParitySettings, backend_name: str, chain: MarkovChain, *,
                perturbed: bool = False) -> ParityCurve:
    """Train a fresh model with one back-end (from perturbed initial weights for the
    control); record losses and gradient checks."""
    curve = ParityCurve(CONTROL if perturbed else backend_name)
    options = LossOptions(reduction=settings.reduction, softcap=settings.config.final_logit_softcapping)
    try:
        backend = resolve_backend(backend_name, settings.config, options, settings.device,
                                  settings.batch * settings.seq)
    except BackendUnavailable as exc:
        curve.status, curve.message = "skipped", str(exc)
        return curve
    curve.version = backend.version
    model = build_model(settings)
    if perturbed:
        perturb_(model, settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    checks = set(settings.check_steps)
    start = time.perf_counter()
    try:
        for step in range(settings.steps):
            inputs, targets = chain.batch(step, settings.batch, settings.seq, settings.ignore_frac, settings.seed)
            inputs, targets = inputs.to(settings.device), targets.to(settings.device)
            reference = None
            if step in checks:  # eager torch in fp32 on the same weights and batch
                _, reference = _loss_and_grads(model, torch_loss, options, inputs, targets, "fp32")
            loss, grads = _loss_and_grads(model, backend.fn, options, inputs, targets, settings.mode)
            if reference is not None:
                curve.grad_checks.append(GradCheck(
                    step, relative_error(grads["lm_head"], reference["lm_head"]),
                    relative_error(grads["hidden"], reference["hidden"]),
                    relative_error(grads["bias"], reference["bias"]) if "bias" in grads else None))
            optimizer.step()
            curve.losses.append(float(loss))
    except torch.OutOfMemoryError as exc:
        curve.status, curve.message = "oom", (message_of(exc).splitlines() or ["out of memory"])[0]
    except Exception as exc:  # a back-end that crashes mid-run is a parity failure with evidence
        curve.status, curve.message = "error", what_it_raised(exc)
    curve.seconds = time.perf_counter() - start
    return curve


def warm_up_training() -> None:
    """What a worker's first curve would otherwise pay inside its time limit: the optimiser's first
    construction imports torch._dynamo (2 s on a two-core CPU)."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])


class ReferenceFailed(RuntimeError):
    """torch's own curve did not train: nothing can be judged against it (the message says why)."""


def run_curve_job(payload: dict) -> dict:
    """The worker's ``parity-curve`` job: ``{"settings": ParitySettings dict, "backend": name,
    "perturbed": bool}`` → the trained :class:`ParityCurve` as a dict (the chain is rebuilt from
    the seed: the same batches as in any other process)."""
    settings = build(ParitySettings, payload["settings"])
    chain = MarkovChain(settings.config.vocab_size, seed=settings.seed)
    return dataclasses.asdict(train_curve(settings, payload["backend"], chain, perturbed=payload["perturbed"]))


def run_parity(settings: ParitySettings, progress: Callable[[str], None] | None = None,
               on_curve: Callable[[ParityReport], None] | None = None,
               finished: ParityReport | None = None,
               train: Callable[[str, bool], ParityCurve] | None = None) -> ParityReport:
    """Train torch, then (``settings.control``) the perturbed-torch control, then every
    back-end in ``settings.backends`` (in that order); judge each against torch.

    ``progress(name)`` is called before each run it trains (for a progress display);
    ``on_curve(report)`` after the reference and after each back-end's run with the report so far
    (``not_run`` names the back-ends still to come), so a caller can save it before a time limit
    or a signal cuts the run.
    ``finished``: the stored report of a run of the same settings that was cut short; its curves
    and verdicts are kept and only what it had not trained runs (each run's batches depend on the
    step only, so a kept curve is the curve this run would train). One whose torch curve did not
    train (no run stores such a report; a folder edited by hand can hold one) keeps nothing: its
    verdicts were judged against no reference.
    ``train(name, perturbed)`` trains one curve (default:
    :func:`train_curve` in this process; the command trains each in a worker, :func:`run_curve_job`,
    where a back-end cannot end the run).
    """
    chain = MarkovChain(settings.config.vocab_size, seed=settings.seed)
    same = finished is not None and finished.settings == settings and any(
        c.backend == REFERENCE and c.status == "ok" for c in finished.curves)
    kept = {c.backend: c for c in finished.curves} if same else {}
    judged = {v.backend: v for v in finished.verdicts} if same else {}

    def curve_of(name: str, perturbed: bool = False) -> ParityCurve:
        label = CONTROL if perturbed else name
        if label in kept:
            return kept[label]
        if progress is not None:
            progress(label)
        if train is not None:
            return train(name, perturbed)
        return train_curve(settings, name, chain, perturbed=perturbed)

    reference = curve_of(REFERENCE)
    if reference.status != "ok":
        raise ReferenceFailed(f"the torch reference run failed: {reference.status}: {reference.message}")
    learned = reference.final_loss() < LEARN_FRACTION * reference.initial_loss()
    report = ParityReport(settings, [reference], [], chain.entropy_rate(), learned)
    if on_curve is not None and REFERENCE not in kept:  # a run cut short from here keeps the reference
        on_curve(report)
    runs = [(REFERENCE, True)] if settings.control else []
    runs += [(name, False) for name in settings.backends if name != REFERENCE]
    for name, perturbed in runs:
        curve = curve_of(name, perturbed)
        report.curves.append(curve)
        verdict = judged.get(curve.backend) if curve.backend in kept else None
        report.verdicts.append(verdict or (judge(settings, curve, reference) if perturbed else
                                           judge(settings, curve, reference, report.noise_floor)))
        if on_curve is not None:
            on_curve(report)
    return report
