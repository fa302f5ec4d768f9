"""``explain``'s calibration: the families left open, and the small measured steps each phase's
line in B is fitted to.

A training step's peak is the maximum over its phases (forward, loss, backward, optimizer).
At a fixed T every phase's allocated peak is linear in B — static bytes (parameters, gradients,
optimizer state) plus per-sample activations, logits and their gradients — but each phase has
its own line, and which phase holds the maximum can change with B (the optimizer step's
foreach copies are fixed in B, the loss region's logits grow with it). So each phase is fitted
separately (:func:`fit_lines`) and the prediction is the maximum of the lines
(:meth:`~fusedce_profiler.judgements.explain.records.Calibration.predict`); a single line
through two overall peaks cannot follow a change of the peak's phase.
"""
from __future__ import annotations

import dataclasses
import itertools

from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
from fusedce_profiler.judgements.explain.records import PHASES, Calibration, Family, Observation


def enumerate_families(obs: Observation, *, attention_impls: tuple[str, ...], tie_choices: tuple[bool, ...],
                       seq_candidates: tuple[int, ...]) -> list[Family]:
    """Every family the observation leaves open (stated dimensions take their one value)."""
    attentions = (obs.attention,) if obs.attention else attention_impls
    ties = (obs.tied,) if obs.tied is not None else tie_choices
    ckpts = (obs.checkpointing,) if obs.checkpointing is not None else (False, True)
    evals = (obs.eval_step,) if obs.eval_step is not None else (False, True)
    seqs = (obs.seq,) if obs.seq else seq_candidates
    return [Family(a, t, c, e, s) for a, t, c, e, s in itertools.product(attentions, ties, ckpts, evals, seqs)]


def family_job(base: ModelJob, family: Family, backend: str, batch: int) -> ModelJob:
    """``base`` set to one family, back-end and batch size (untraced: the calibration needs the
    phase meters only)."""
    config = base.config.replace(tie_word_embeddings=family.tied)
    source = base.source
    if source is not None and source.get("kind") == "hf":
        source = {**source, "hf_config": {**source["hf_config"], "tie_word_embeddings": family.tied}}
    return dataclasses.replace(base, config=config, source=source, backend=backend, batch=batch, seq=family.seq,
                               attention=family.attention, checkpointing=family.checkpointing,
                               eval_step=family.eval_step, trace=False)


def calibration_jobs(base: ModelJob, families: list[Family], backends: tuple[str, str],
                     batches: tuple[int, ...] | None) -> list[tuple[Family, str, list[ModelJob]]]:
    """The measured steps behind the predictions: each family × back-end × batch size
    (``batches``: the same for every T; ``None``: :func:`batches_for` each family's T)."""
    return [(family, backend, [family_job(base, family, backend, b) for b in batches or batches_for(family.seq)])
            for family in families for backend in backends]


CALIBRATION_TOKENS = (8192, 16384)
"""Tokens (B·T) of the two calibration steps per family on a GPU: B=2 and 4 at T=1024 were measured
to under-predict the loss phase by 8–10 % at B=46–59 (T=512, H200), so the steps are made as large
as the extrapolation's target allows a GPU to measure quickly."""


def batches_for(seq: int, tokens: tuple[int, ...] = CALIBRATION_TOKENS) -> tuple[int, ...]:
    """Calibration batch sizes at sequence length ``seq``: ``tokens // seq``, at least 1 and 2."""
    first = max(1, tokens[0] // seq)
    return first, max(first + 1, tokens[1] // seq)


def halved(batches: list[int]) -> tuple[int, ...]:
    """Calibration batch sizes half as large (at least 1 and 2), for a step that ran out of memory."""
    first = max(1, batches[0] // 2)
    return first, max(first + 1, batches[-1] // 2)


def _line(batches: list[int], values: list[int | None]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of ``values`` against ``batches``; ``None`` with fewer
    than two distinct batch sizes measured."""
    points = [(b, v) for b, v in zip(batches, values) if v is not None]
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mv = sum(v for _, v in points) / n
    slope = sum((b - mb) * (v - mv) for b, v in points) / sum((b - mb) ** 2 for b, _ in points)
    return mv - slope * mb, slope


def fit_lines(cal: Calibration) -> Calibration:
    """Fit every phase's line (in place; returns ``cal``). A phase measured at fewer than two
    batch sizes leaves the calibration unfitted: a maximum over a partial set of phases would
    under-predict."""
    lines = {}
    for name, values in cal.phase_peaks.items():
        line = _line(cal.batches, values)
        if line is None:
            cal.lines = {}
            return cal
        lines[name] = line
    cal.lines = lines
    return cal


def calibration_from_results(family: Family, backend: str, batches: list[int],
                             results: list[ModelResult | None]) -> Calibration:
    """A fitted :class:`Calibration` from the measured steps (``None``: not run yet)."""
    cal = Calibration(family, backend, list(batches), [r.status if r else "not run" for r in results])
    cal.phase_peaks = {name: [None] * len(batches) for name in PHASES}
    cal.reserved = [None] * len(batches)
    cal.context = [None] * len(batches)
    cal.static = [None] * len(batches)
    for i, r in enumerate(results):
        if r is None or r.status != "ok" or r.memory is None:
            continue
        for phase in r.memory.phases:
            if phase.name in cal.phase_peaks:
                cal.phase_peaks[phase.name][i] = phase.peak_bytes
        cal.reserved[i] = r.memory.peak_reserved
        cal.context[i] = r.memory.context
        cal.static[i] = r.memory.static
    return fit_lines(cal)


def reserved_ratios(calibrations: list[Calibration]) -> list[float]:
    """Measured peak reserved / peak allocated of every calibration step (CUDA; empty on the CPU)."""
    ratios = []
    for cal in calibrations:
        for figure, reserved in zip(cal.figures, cal.reserved):
            if figure and reserved:
                ratios.append(reserved / figure)
    return ratios


def describe(cal: Calibration, unit=lambda v: f"{v / (1 << 20):.0f} MiB") -> str:
    """One progress line: the back-end, family and each batch's peak (or status)."""
    return f"{cal.backend} · {cal.family.label()}: " + ", ".join(
        f"B={b}: {unit(f)}" if f is not None else f"B={b}: {s}"
        for b, f, s in zip(cal.batches, cal.figures, cal.statuses))
