"""``explain``'s judging: the hypotheses each calibrated family gives, ranked against the readings,
their full-size confirmation, and the confirmed steps the calibration line did not predict.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from fusedce_profiler.judgements.explain.records import GIB, MIB, Calibration, Hypothesis, Observation
from fusedce_profiler.judgements.explain.calibration import figure_of
from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult


def _m(value: float) -> str:
    """Bytes as MiB with enough digits to read small CPU figures too."""
    mib = value / MIB
    return f"{mib:,.0f} MiB" if abs(mib) >= 100 else f"{mib:.3g} MiB"


def _batch_candidates(obs: Observation, naive: Calibration) -> list[int]:
    if obs.batch:
        return [obs.batch]
    if naive.slope is None or naive.slope <= 0:
        return []
    exact = (obs.naive_mib * MIB - naive.intercept) / naive.slope
    if exact < 0.5:
        return [1]
    return sorted({max(1, math.floor(exact)), max(1, math.ceil(exact))})


def build_hypotheses(obs: Observation, calibrations: list[Calibration], naive_backend: str = "torch") -> list[Hypothesis]:
    """Every (family, batch, fused active?) hypothesis with its predictions, ranked best first."""
    by_key = {(c.family, c.backend): c for c in calibrations}
    naive_obs, fused_obs, card = obs.naive_mib * MIB, obs.fused_mib * MIB, obs.total_gib * GIB
    out = []
    families = list(dict.fromkeys(c.family for c in calibrations))
    actives = (obs.fused_active,) if obs.fused_active is not None else (True, False)
    for family in families:
        naive = by_key.get((family, naive_backend))
        fused = by_key.get((family, obs.fused_backend))
        if naive is None or fused is None or naive.slope is None:
            continue
        for batch in _batch_candidates(obs, naive):
            for active in actives:
                if active and fused.slope is None:
                    continue
                pn = naive.predict(batch)
                pf = fused.predict(batch) if active else pn
                en, ef = (pn - naive_obs) / naive_obs, (pf - fused_obs) / fused_obs
                reasons = []
                if abs(en) > obs.tolerance:
                    reasons.append(f"predicts naive {_m(pn)} vs {_m(naive_obs)} seen ({en:+.1%})")
                if abs(ef) > obs.tolerance:
                    reasons.append(f"predicts fused {_m(pf)} vs {_m(fused_obs)} seen ({ef:+.1%})")
                if max(pn, pf) > card:
                    reasons.append(f"needs {max(pn, pf) / GIB:.1f} GiB, more than the {obs.total_gib:g} GiB card")
                why = "; ".join(reasons) if reasons else (f"naive {_m(pn)} ({en:+.1%}), fused "
                                                          f"{_m(pf)} ({ef:+.1%}), within "
                                                          f"±{obs.tolerance:.0%}")
                out.append(Hypothesis(family, batch, active, pn, pf, en, ef, not reasons, why))
    out.sort(key=lambda h: (not h.consistent, h.score))
    return out


def confirm(hypotheses: list[Hypothesis], base: ModelJob, fused_backend: str, obs: Observation,
            runner: Callable[[list[ModelJob]], list[ModelResult]], top: int = 3) -> None:
    """Measure the ``top`` best hypotheses at full size (naive and fused) and re-judge them."""
    for h in hypotheses[:top]:
        family = h.family
        config = base.config.replace(tie_word_embeddings=family.tied)
        jobs = [dataclasses.replace(base, config=config, backend=b, batch=h.batch, seq=family.seq,
                                    attention=family.attention, checkpointing=family.checkpointing,
                                    eval_step=family.eval_step, trace=False)
                for b in ("torch", fused_backend)]
        naive, fused = runner(jobs)
        h.measured_naive, h.measured_fused = figure_of(naive), figure_of(fused)
        if h.measured_naive is None:
            h.consistent, h.why = False, f"measured: torch {naive.status} at this size ({naive.message[:80]})"
            continue
        measured_fused = h.measured_fused if h.fused_active else h.measured_naive
        if measured_fused is None:
            h.consistent, h.why = False, f"measured: {fused_backend} {fused.status} at this size"
            continue
        en = (h.measured_naive - obs.naive_mib * MIB) / (obs.naive_mib * MIB)
        ef = (measured_fused - obs.fused_mib * MIB) / (obs.fused_mib * MIB)
        h.error_naive, h.error_fused = en, ef
        h.consistent = max(abs(en), abs(ef)) <= obs.tolerance and max(h.measured_naive, measured_fused) <= \
            obs.total_gib * GIB
        h.why = (f"measured naive {_m(h.measured_naive)} ({en:+.1%}), fused "
                 f"{_m(measured_fused)} ({ef:+.1%})" + ("" if h.fused_active else
                                                                   " (torch's figure: fused path not active)"))
    hypotheses.sort(key=lambda h: (not h.consistent, h.score))


def calibration_misses(hypotheses: list[Hypothesis], tolerance: float) -> list[str]:
    """Sentences for the confirmed hypotheses whose full-size measurement differs from the
    calibrated prediction by more than ``tolerance`` (relative): where that happens, the
    straight line through the small calibration steps does not hold up to that batch size,
    and the verdicts on the configurations that were only predicted are not evidence."""
    misses = []
    for h in hypotheses:
        for what, measured, predicted in (("torch", h.measured_naive, h.predicted_naive),
                                          ("the fused loss", h.measured_fused, h.predicted_fused)):
            if what == "the fused loss" and not h.fused_active:
                continue
            if measured is None or not predicted:
                continue
            gap = (measured - predicted) / predicted
            if abs(gap) > tolerance:
                misses.append(f"{what} at {h.label()}: predicted {_m(predicted)}, measured {_m(measured)} "
                              f"({gap:+.0%})")
    return misses
