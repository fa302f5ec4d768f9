"""Causes users actually hit beside the enumerated configuration, each consistent or ruled out
with numbers: the optimizer step as the peak, the allocator's cache left by an evaluation pass,
the card capping both runs, and another process on the GPU; and, per attention
implementation and fused-path state, the families ruled out at every batch size.
"""
from __future__ import annotations

from fusedce_profiler.judgements.explain.allocator import DeviceTerms, predict_reading, saving_tolerance
from fusedce_profiler.judgements.explain.records import GIB, MIB, Calibration, Hypothesis, Observation, OtherHypothesis
from fusedce_profiler.judgements.explain.verdict import MAX_BATCH


def _count(hs: list[Hypothesis], predicate) -> int:
    return sum(1 for h in hs if predicate(h))


def other_hypotheses(obs: Observation, hypotheses: list[Hypothesis], calibrations: list[Calibration],
                     terms: DeviceTerms) -> list[OtherHypothesis]:
    """The four other causes, judged from the ranked hypotheses and the calibrations."""
    consistent = [h for h in hypotheses if h.consistent]
    out = []
    optimizer = _count(consistent, lambda h: "optimizer" in (h.peak_phase_naive, h.peak_phase_fused))
    phases = sorted({h.peak_phase_naive for h in consistent})
    out.append(OtherHypothesis(
        "the optimizer step (AdamW's foreach copies) holds the peak", optimizer > 0,
        f"{optimizer} of {len(consistent)} consistent configurations peak in the optimizer step" if optimizer else
        (f"no consistent configuration peaks there (their peaks: {', '.join(phases)})" if consistent else
         "no configuration is consistent")))
    with_eval = [h for h in hypotheses if h.family.eval_step]
    kept = _count(with_eval, lambda h: h.consistent)
    out.append(OtherHypothesis(
        "the allocator's cache left by an evaluation pass", kept > 0,
        f"{kept} consistent configurations ran an evaluation pass first" if kept else
        (f"ruled out: all {len(with_eval)} configurations with an evaluation pass first are inconsistent"
         if with_eval else "not enumerated (--no-eval-step)")))
    card = obs.total_gib * GIB
    capped = _count(consistent, lambda h: h.capped)
    share = f"the readings are {obs.naive_mib * MIB / card:.0%} and {obs.fused_mib * MIB / card:.0%} of the card"
    out.append(OtherHypothesis(
        "the card caps the runs (the allocator frees its cache and retries)", capped > 0,
        f"{capped} consistent configurations reach the cap; {share}" if capped else
        f"no consistent configuration reaches the cap; {share}"))
    out.append(_another_process(obs, calibrations, terms))
    return out


def _another_process(obs: Observation, calibrations: list[Calibration], terms: DeviceTerms) -> OtherHypothesis:
    """Another process holding X MiB shifts both readings by X: the saving alone must then fit.
    The smallest such X over the families whose saving fits at some B is reported."""
    name = "another process on the GPU"
    card = obs.total_gib * GIB
    seen_saving = (obs.naive_mib - obs.fused_mib) * MIB
    by_key = {(c.family, c.backend): c for c in calibrations}
    best = None
    for (family, backend), naive in by_key.items():
        fused = by_key.get((family, obs.fused_backend))
        if backend != "torch" or fused is None or not naive.fitted or not fused.fitted:
            continue
        for b in range(1, MAX_BATCH + 1):
            rn, rf = predict_reading(naive, b, terms, card), predict_reading(fused, b, terms, card)
            other = obs.naive_mib * MIB - rn.value
            if other <= 0 or not rn.fits:
                break
            if abs((rn.value - rf.value) - seen_saving) <= saving_tolerance(rn, rf, terms).total:
                if best is None or other < best[0]:
                    best = (other, b, family)
    if best is None:
        return OtherHypothesis(name, False, "ruled out: with any amount held by another process, no enumerated "
                                            "configuration gives the saving seen")
    other, b, family = best
    return OtherHypothesis(name, True, f"cannot be ruled out from two readings: {other / MIB:,.0f} MiB held by "
                                       f"another process beside B={b}, {family.label()}, fused path active would "
                                       "give both; nvidia-smi's process list shows whether one runs")


def ruled_out_groups(hypotheses: list[Hypothesis], obs: Observation) -> list[str]:
    """Per (attention, fused path) group whose every family is ruled out: one sentence with the
    saving it would have had at any B that reaches the naive reading."""
    groups: dict[tuple[str, bool], list[Hypothesis]] = {}
    for h in hypotheses:
        groups.setdefault((h.family.attention, h.fused_active), []).append(h)
    seen = (obs.naive_mib - obs.fused_mib) * MIB
    sentences = []
    for (attention, active), hs in groups.items():
        if any(h.consistent for h in hs):
            continue
        reaching = [h for h in hs if h.saving_range is not None]
        state = "with the fused path active" if active else "with the fused path NOT active"
        if not reaching:
            sentences.append(f"{attention} {state}: ruled out in all {len(hs)} families — none reaches the naive "
                             "reading at a batch size that fits the card")
            continue
        lo, hi = min(h.saving_range[0] for h in reaching), max(h.saving_range[1] for h in reaching)
        bound = (f"≥ {lo / GIB:.2f} GiB" if lo > seen else f"≤ {hi / GIB:.2f} GiB") if lo > seen or hi < seen \
            else f"{lo / GIB:.2f}–{hi / GIB:.2f} GiB"
        sentences.append(f"{attention} {state}: ruled out in all {len(hs)} families — at any B that reaches the "
                         f"naive reading it would save {bound}, against {seen / GIB:.2f} GiB seen")
    return sentences
