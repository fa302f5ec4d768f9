"""``explain``'s judging: every family's hypotheses scored jointly on the naive reading and the
saving, and their full-size confirmation on a GPU.

For a family and a fused-path state, every batch size B is predicted
(:func:`~fusedce_profiler.judgements.explain.allocator.predict_reading`); the naive reading pins
B (the batch sizes within its tolerance form ``batch_range``) and the saving decides: with the
fused path active the fused step is the fused back-end's own calibration, without it the
fused step is the naive one (saving 0). With a stand-in model each B is also tried with the
extra activations another implementation may keep (0 up to the measured spread, the same in both
steps of the hypothesis). The hypothesis kept per family is the (B, extra activations) pair with
the smallest joint score — the larger of the two errors in units of their tolerances.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
from fusedce_profiler.judgements.explain.allocator import (DeviceTerms, Reading, naive_tolerance, predict_reading,
                                                           saving_tolerance)
from fusedce_profiler.judgements.explain.calibration import family_job
from fusedce_profiler.judgements.explain.records import GIB, MIB, Calibration, Hypothesis, Observation

MAX_BATCH = 4096
"""Largest batch size scanned when B is not stated."""


def _m(value: float) -> str:
    """Bytes as MiB with enough digits to read small CPU figures too."""
    mib = value / MIB
    return f"{mib:,.0f} MiB" if abs(mib) >= 100 else f"{mib:.3g} MiB"


def _score(rn: Reading, rf: Reading, obs: Observation, terms: DeviceTerms):
    naive_seen, saving_seen = obs.naive_mib * MIB, (obs.naive_mib - obs.fused_mib) * MIB
    tn, ts = naive_tolerance(rn, terms), saving_tolerance(rn, rf, terms)
    en, es = rn.value - naive_seen, (rn.value - rf.value) - saving_seen
    return en, es, tn, ts, max(abs(en) / max(tn.total, 1.0), abs(es) / max(ts.total, 1.0))


def _family_hypothesis(obs: Observation, naive: Calibration, fused: Calibration | None, active: bool,
                       terms: DeviceTerms) -> Hypothesis | None:
    card = obs.total_gib * GIB
    batches = [obs.batch] if obs.batch else range(1, MAX_BATCH + 1)
    scored, matching = [], []
    extras = terms.extras(naive.family.seq)

    def evaluate(b: int, extra: float):
        rn = predict_reading(naive, b, terms, card, extra)
        rf = predict_reading(fused, b, terms, card, extra) if active else rn
        if rn is None or rf is None:
            return None
        en, es, tn, ts, score = _score(rn, rf, obs, terms)
        return score, b, rn, rf, en, es, tn, ts

    for b in batches:
        # The naive reading grows with the extra activations: when even the largest reads below
        # it (or even none reads above it), only that end is the closest; the rest need no sweep.
        low = evaluate(b, extras[0])
        high = evaluate(b, extras[-1]) if len(extras) > 1 else low  # the user's own model: one point
        if low is None or high is None:
            return None
        if high[4] < -high[6].total:
            tried = [high]
        elif low[4] > low[6].total or high is low:
            tried = [low]
        else:
            tried = [low, *(evaluate(b, extra) for extra in extras[1:-1]), high]
        for entry in tried:
            scored.append(entry)
            if abs(entry[4]) <= entry[6].total:
                matching.append((b, entry[2].value - entry[3].value))
        if not obs.batch and (not low[2].fits or low[4] > low[6].total):
            break  # a larger B reads higher still and cannot fit either, whatever the extra activations
    if not scored:
        return None
    # Among the (B, extra activations) pairs that reach the naive reading when there are any: B is pinned by it.
    pool = [s for s in scored if abs(s[4]) <= s[6].total] or scored
    score, b, rn, rf, en, es, tn, ts = min(pool, key=lambda s: s[0])
    fits = rn.fits and rf.fits
    consistent = score <= 1.0 and fits
    saving_seen = (obs.naive_mib - obs.fused_mib) * MIB
    brange = (min(b for b, _ in matching), max(b for b, _ in matching)) if matching else None
    if consistent:
        why = (f"naive {_m(rn.value)} ({_m(en)} off, ±{_m(tn.total)}), saving "
               f"{_m(rn.value - rf.value)} vs {_m(saving_seen)} seen ({_m(es)} off, ±{_m(ts.total)})"
               + (f", with {rn.extra / naive.family.seq / 1024:,.0f} KiB of activations per token more than the "
                  "model" if rn.extra > 0 else ""))
    elif not fits:
        why = f"needs {_m(max(rn.allocated, rf.allocated) + terms.context)}, more than the {obs.total_gib:g} GiB card"
    elif not matching:
        why = (f"no batch size reaches the naive reading: the closest, B={b}, predicts {_m(rn.value)} "
               f"({_m(en)} off, tolerance ±{_m(tn.total)})")
    else:
        lo, hi = min(s for _, s in matching), max(s for _, s in matching)
        span = f"{brange[0]}–{brange[1]}" if brange[1] > brange[0] else f"{brange[0]}"
        why = (f"at every B that reaches the naive reading (B={span}) it would save {_m(lo)}"
               + (f"–{_m(hi)}" if hi - lo >= MIB else "") + f", not the {_m(saving_seen)} seen "
               f"(tolerance ±{_m(ts.total)})")
    srange = (min(v for _, v in matching), max(v for _, v in matching)) if matching else None
    return Hypothesis(naive.family, b, active, rn.value, rf.value, en, es, tn, ts, consistent, why,
                      peak_phase_naive=rn.phase, peak_phase_fused=rf.phase, batch_range=brange, saving_range=srange,
                      capped=rn.capped or rf.capped, allocated_naive=rn.allocated,
                      allocated_fused=rf.allocated,
                      extra_activations=rn.extra / naive.family.seq)


def build_hypotheses(obs: Observation, calibrations: list[Calibration], terms: DeviceTerms,
                     naive_backend: str = "torch") -> list[Hypothesis]:
    """One hypothesis per (family, fused path active or not) with its predictions, ranked best
    first (consistent ones first, then by joint score)."""
    by_key = {(c.family, c.backend): c for c in calibrations}
    actives = (obs.fused_active,) if obs.fused_active is not None else (True, False)
    out = []
    for family in dict.fromkeys(c.family for c in calibrations):
        naive = by_key.get((family, naive_backend))
        fused = by_key.get((family, obs.fused_backend))
        if naive is None or not naive.fitted:
            continue
        for active in actives:
            if active and (fused is None or not fused.fitted):
                continue
            h = _family_hypothesis(obs, naive, fused, active, terms)
            if h is not None:
                out.append(h)
    out.sort(key=lambda h: (not h.consistent, h.score))
    return out


def confirmation_jobs(h: Hypothesis, base: ModelJob, fused_backend: str, card_bytes: int,
                      batch: int | None = None) -> list[ModelJob]:
    """The full-size steps of ``h`` (at ``batch``, default its own) under the card's cap: the
    naive step, and the fused one when the hypothesis has the fused path active."""
    backends = ("torch", fused_backend) if h.fused_active else ("torch",)
    return [dataclasses.replace(family_job(base, h.family, b, batch or h.batch), memory_limit_bytes=card_bytes)
            for b in backends]


def measured_reading(result: ModelResult, terms: DeviceTerms) -> int | None:
    """A full-size step's reading on the user's card: its peak reserved plus the user's context
    (the context measured here is this GPU's, not theirs)."""
    if result.status != "ok" or result.memory is None or result.memory.peak_reserved is None:
        return None
    return int(result.memory.peak_reserved + terms.context)


def next_batch(batch: int, result: ModelResult, measured: int, seen: float) -> int:
    """The batch size whose naive reading should land on ``seen`` (bytes), from one measured
    full-size step: its reading grows by about (reading × transient / peak) / B per sample."""
    m = result.memory
    transient = max(m.peak - m.static, 1)
    per_sample = measured * transient / max(m.peak, 1) / batch
    return max(1, round(batch + (seen - measured) / per_sample))


def _model_shift(cal: Calibration | None, batch: int, extra_per_token: float, terms: DeviceTerms,
                 card: float) -> tuple[float, Reading | None]:
    """What a hypothesis's extra activations add to the reading of the stand-in's step at ``batch``
    (bytes; the model's own prediction with and without them), and the stand-in's own prediction.

    A full-size confirmation measures the stand-in model, which keeps none of the extra
    activations another implementation may keep (:data:`~fusedce_profiler.judgements.explain.
    allocator.IMPLEMENTATION_SPREAD`): its reading is compared with the prediction *without* them
    (the prediction's measured error), and judged for the hypothesis *with* the modelled shift added."""
    if cal is None:
        return 0.0, None
    bare = predict_reading(cal, batch, terms, card, 0.0)
    extra = extra_per_token * cal.family.seq
    if bare is None or extra <= 0:
        return 0.0, bare
    shifted = predict_reading(cal, batch, terms, card, extra)
    return (shifted.value - bare.value if shifted is not None else 0.0), bare


def confirm(hypotheses: list[Hypothesis], base: ModelJob, obs: Observation, terms: DeviceTerms,
            runner: Callable[[list[ModelJob]], list[ModelResult]], top: int = 3,
            calibrations: list[Calibration] = (), naive_backend: str = "torch") -> list[str]:
    """Measure the ``top`` best consistent hypotheses at full size under the card's cap and
    re-judge them on the measured readings. B is searched on the naive reading: when the step at
    the predicted B misses it by more than its tolerance, one more B (:func:`next_batch`) is
    measured and the closer of the two kept. With a stand-in model (``calibrations`` given and a
    hypothesis with extra activations) the measured readings are the stand-in's: each is judged with
    the modelled shift of the hypothesis's extra activations added (:func:`_model_shift`), and its
    prediction error is against the stand-in's own prediction. Returns one sentence per hypothesis
    with the prediction's measured error (reading and allocated peak)."""
    card = int(obs.total_gib * GIB)
    seen_naive, seen_saving = obs.naive_mib * MIB, (obs.naive_mib - obs.fused_mib) * MIB
    by_key = {(c.family, c.backend): c for c in calibrations}
    sentences = []
    for h in [h for h in hypotheses if h.consistent][:top]:
        naive_cal, fused_cal = by_key.get((h.family, naive_backend)), by_key.get((h.family, obs.fused_backend))

        def shifts(batch: int) -> tuple[float, float, Reading | None]:
            shift_naive, bare = _model_shift(naive_cal, batch, h.extra_activations, terms, card)
            shift_fused = _model_shift(fused_cal, batch, h.extra_activations, terms, card)[0] if h.fused_active \
                else shift_naive
            return shift_naive, shift_fused, bare

        predicted_batch = h.batch
        shift_naive, shift_fused, bare = shifts(h.batch)
        results = runner(confirmation_jobs(h, base, obs.fused_backend, card))
        mn = measured_reading(results[0], terms)
        first, first_mn, first_bare = results[0], mn, bare
        if mn is not None and abs(mn + shift_naive - seen_naive) > h.tolerance_naive.total:
            batch = next_batch(h.batch, results[0], mn, seen_naive - shift_naive)
            if batch != h.batch:
                retry = runner(confirmation_jobs(h, base, obs.fused_backend, card, batch))
                again = measured_reading(retry[0], terms)
                retry_shift_naive, retry_shift_fused, _ = shifts(batch)
                if again is not None and abs(again + retry_shift_naive - seen_naive) < abs(mn + shift_naive - seen_naive):
                    results, mn, h.batch = retry, again, batch
                    shift_naive, shift_fused = retry_shift_naive, retry_shift_fused
        naive = results[0]
        fused = results[1] if h.fused_active else naive
        h.alloc_retries = naive.extra.get("num_alloc_retries")
        mf = measured_reading(fused, terms)
        if mn is None or mf is None:
            bad = naive if mn is None else fused
            h.consistent = False
            h.why = f"measured at full size: {bad.job.backend} {bad.status}" + (
                f" ({bad.message.splitlines()[0][:80]})" if bad.message else "")
            sentences.append(f"{h.label()}: {bad.status} at full size under the {obs.total_gib:g} GiB cap")
            continue
        mn, mf = int(mn + shift_naive), int(mf + shift_fused)
        h.measured_naive, h.measured_fused = mn, mf
        en, es = mn - seen_naive, (mn - mf) - seen_saving
        h.error_naive, h.error_saving = en, es
        h.consistent = abs(en) <= h.tolerance_naive.total and abs(es) <= h.tolerance_saving.total
        shifted = f" with {_m(shift_naive)} modelled for the extra activations" if shift_naive else ""
        h.why = (f"measured at full size{shifted}: naive {_m(mn)} ({_m(en)} off), saving {_m(mn - mf)} ({_m(es)} off)"
                 + ("" if h.fused_active else " (fused path not active: torch's step)"))
        sentence = f"{h.label()}: "
        if first_mn is not None:
            # the prediction of the model that ran: the stand-in's own (no extra activations) when known
            predicted, allocated = ((first_bare.value, first_bare.allocated) if first_bare is not None
                                    else (h.predicted_naive, h.allocated_naive))
            gap = (first_mn - predicted) / predicted
            alloc_gap = (first.memory.peak - allocated) / max(allocated, 1.0)
            sentence += (f"at the predicted B={predicted_batch} the model's step was predicted at {_m(predicted)}, "
                         f"measured {_m(first_mn)} ({gap:+.1%}), allocated peak off by {alloc_gap:+.1%}")
        if h.batch != predicted_batch:
            sentence += f"; B searched on the naive reading: B={h.batch} measures {_m(mn)}"
        if shift_naive:
            sentence += f"; judged with {_m(shift_naive)} more for the extra activations"
        sentences.append(sentence + f"; allocator retries {h.alloc_retries}")
    hypotheses.sort(key=lambda h: (not h.consistent, h.score))
    return sentences
