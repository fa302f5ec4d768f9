"""``explain``'s calibration: the families left open, and the small measured steps fitted linearly in B.

Each family × back-end is measured at a few batch sizes; :class:`~fusedce_profiler.judgements.explain.records.Calibration`
holds the figures (bytes) and their least-squares line, which is what the hypotheses predict from.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

from fusedce_profiler.judgements.explain.records import MIB, Calibration, Family, Observation
from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult


def enumerate_families(obs: Observation, *, attention_impls: tuple[str, ...], tie_choices: tuple[bool, ...],
                       seq_candidates: tuple[int, ...]) -> list[Family]:
    """Every family the observation leaves open (stated dimensions take their one value)."""
    attentions = (obs.attention,) if obs.attention else attention_impls
    ties = (obs.tied,) if obs.tied is not None else tie_choices
    ckpts = (obs.checkpointing,) if obs.checkpointing is not None else (False, True)
    evals = (obs.eval_step,) if obs.eval_step is not None else (False, True)
    seqs = (obs.seq,) if obs.seq else seq_candidates
    return [Family(a, t, c, e, s) for a, t, c, e, s in itertools.product(attentions, ties, ckpts, evals, seqs)]


def figure_of(result: ModelResult) -> int | None:
    """The figure compared with the readings: nvidia-smi at the step's peak (CUDA), else the
    peak allocated bytes (CPU)."""
    if result.status != "ok" or result.memory is None:
        return None
    m = result.memory
    return m.smi_peak if m.smi_peak is not None else m.peak


def _fit(batches: list[int], figures: list[int | None]) -> tuple[float, float] | None:
    points = [(b, f) for b, f in zip(batches, figures) if f is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mf = sum(f for _, f in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    if var == 0:
        return None
    slope = sum((b - mb) * (f - mf) for b, f in points) / var
    return mf - slope * mb, slope


def calibration_jobs(base: ModelJob, families: list[Family], backends: tuple[str, str],
                     batches: tuple[int, ...]) -> list[tuple[Family, str, list[ModelJob]]]:
    """The measured steps behind the predictions: each family × back-end × batch size."""
    out = []
    for family in families:
        config = base.config.replace(tie_word_embeddings=family.tied)
        source = base.source
        if source is not None and source.get("kind") == "hf":
            source = {**source, "hf_config": {**source["hf_config"], "tie_word_embeddings": family.tied}}
        for backend in backends:
            jobs = [dataclasses.replace(base, config=config, source=source, backend=backend, batch=b, seq=family.seq,
                                        attention=family.attention, checkpointing=family.checkpointing,
                                        eval_step=family.eval_step, trace=False) for b in batches]
            out.append((family, backend, jobs))
    return out


def calibrate(base: ModelJob, families: list[Family], backends: tuple[str, str], batches: tuple[int, ...],
              runner: Callable[[list[ModelJob]], list[ModelResult]],
              progress: Callable[[str], None] = lambda line: None) -> list[Calibration]:
    """Run the calibration steps (``runner`` takes one family's jobs of one back-end) and fit lines."""
    calibrations = []
    for family, backend, jobs in calibration_jobs(base, families, backends, batches):
        results = runner(jobs)
        figures = [figure_of(r) for r in results]
        cal = Calibration(family, backend, list(batches), figures, [r.status for r in results])
        line = _fit(cal.batches, figures)
        if line is not None:
            cal.intercept, cal.slope = line
        calibrations.append(cal)
        progress(f"{backend} · {family.label()}: " + ", ".join(
            f"B={b}: {f / MIB:.0f} MiB" if f is not None else f"B={b}: {s}" for b, f, s in
            zip(cal.batches, figures, cal.statuses)))
    return calibrations
