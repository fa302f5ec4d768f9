"""``explain``'s conclusion: what the consistent hypotheses say together (per dimension: settled,
open, ruled out), whether that is a decision, and the one measurement whose outcomes differ
between those that remain.

The separating measurement is a run of the user's *own* step — the recorder callback, one line
in their script — because a run of our model at a stated setting gives the same figure whatever
the truth is. Each remaining group of hypotheses predicts what that report shows: the step's
allocated peak and the phase holding it, or, when the groups differ in whether the fused path is
active, whether a B·T×V logits tensor is kept. A sentence is only made when its outcomes differ
by more than their tolerances; otherwise it says that no measurement of the step separates them.
"""
from __future__ import annotations

from fusedce_profiler.judgements.explain.records import DIMENSIONS, GIB, MIB, Hypothesis, Observation, Separation

RECORDER_LINE = ("callbacks=[fusedce_profile.lightning.StepRecorderCallback(\"recorded\")] in your Trainer "
                 "(or fusedce_profile.record_step in a plain loop)")


def _shown(dimension: str, value) -> str:
    if dimension == "fused_active":
        return "fused path active" if value else "fused path NOT active"
    if dimension == "seq":
        return f"T={value}"
    if isinstance(value, bool):
        return dimension.replace("_", " ") + (" on" if value else " off")
    return f"{dimension.replace('_', ' ')} {value}"


def separating_measurement(hypotheses: list[Hypothesis], obs: Observation, vocab: int,
                           logits_bytes: int = 2) -> Separation | None:
    """The recorder run that splits the consistent hypotheses (``None`` with fewer than two).

    Tries each dimension in :data:`DIMENSIONS` order on which they differ; the first whose
    groups predict allocated peaks of the user's fused step further apart than the groups'
    model allowances wins. When the fused path's state differs, the kept logits
    (B·T·V·``logits_bytes``) separate it whatever the peaks do.
    """
    consistent = [h for h in hypotheses if h.consistent]
    if len(consistent) < 2:
        return None
    states = {h.fused_active for h in consistent}
    if len(states) == 2:
        sizes = sorted(h.batch * h.family.seq * vocab * logits_bytes for h in consistent if not h.fused_active)
        span = f"{sizes[0] / MIB:,.0f}" + (f"–{sizes[-1] / MIB:,.0f}" if sizes[-1] > sizes[0] else "")
        predictions = [("fused path active", 0.0, "MiB of logits kept for backward"),
                       ("fused path NOT active", sizes[0] / MIB, "MiB or more of logits kept for backward")]
        sentence = (f"record one step of your fused run with {RECORDER_LINE}: if the fused path is active its "
                    f"report finds no B·T×V logits tensor kept for backward; if it is not, the logits detector "
                    f"names a {span} MiB tensor (B·T×V at V={vocab}, by the remaining hypotheses) and the line "
                    "that makes it")
        return Separation("fused_active", RECORDER_LINE, predictions, sentence)
    for dimension in DIMENSIONS:
        values = list(dict.fromkeys(h.value(dimension) for h in consistent))
        if len(values) < 2:
            continue
        best = {v: next(h for h in consistent if h.value(dimension) == v) for v in values}
        peaks = {v: h.allocated_fused for v, h in best.items()}
        allowance = max(h.tolerance_naive.model + h.tolerance_naive.noise for h in best.values())
        ordered = sorted(peaks.values())
        if min(b - a for a, b in zip(ordered, ordered[1:])) <= allowance:
            continue
        predictions = [(_shown(dimension, v), peaks[v] / GIB, f"GiB allocated peak ({best[v].peak_phase_fused})")
                       for v in values]
        outcomes = "; ".join(f"{name}: {value:.2f} {unit}" for name, value, unit in predictions)
        sentence = (f"record one step of your fused run with {RECORDER_LINE}: its allocated peak (free of the "
                    f"context and the allocator's cache) tells {dimension.replace('_', ' ')} apart — {outcomes} "
                    f"(each ±{allowance / GIB:.2f} GiB)")
        return Separation(dimension, RECORDER_LINE, predictions, sentence)
    open_dims = [d for d in DIMENSIONS[:-1] if len({h.value(d) for h in consistent}) > 1]
    sentence = (f"no measurement of the step separates them: every remaining hypothesis predicts the same allocated "
                f"peak within its allowance; they differ only in "
                f"{', '.join(d.replace('_', ' ') for d in open_dims) or 'the batch size'}, which your training "
                "script states")
    return Separation("none", "", [], sentence)


def dimension_summary(hypotheses: list[Hypothesis]) -> str:
    """Per enumerated dimension (batch aside): the values every consistent hypothesis shares
    (settled), the values some consistent hypotheses take (open), and the values no consistent
    hypothesis takes (ruled out). ``""`` when nothing is consistent."""
    consistent = [h for h in hypotheses if h.consistent]
    if not consistent:
        return ""
    settled, open_, ruled = [], [], []
    for dim in DIMENSIONS[:-1]:
        tried = sorted({h.value(dim) for h in hypotheses}, key=str)
        kept = sorted({h.value(dim) for h in consistent}, key=str)
        if len(tried) < 2:
            continue
        if len(kept) == 1:
            settled.append(_shown(dim, kept[0]))
        else:
            open_.append(" or ".join(_shown(dim, v) for v in kept))
        ruled += [_shown(dim, v) for v in tried if v not in kept]
    batches = sorted({b for h in consistent for b in (h.batch_range or (h.batch, h.batch))})
    parts = [f"consistent batch sizes: {batches[0]}" + (f"–{batches[-1]}" if len(batches) > 1 else "")]
    if settled:
        parts.append("every consistent hypothesis has " + ", ".join(settled))
    if open_:
        parts.append("still open: " + "; ".join(open_))
    if ruled:
        parts.append("ruled out (no consistent hypothesis has it): " + ", ".join(ruled))
    return "; ".join(parts) + "."


def conclude(hypotheses: list[Hypothesis], obs: Observation, *, measured: bool) -> tuple[bool, str]:
    """(decided, sentence). "Decided" is about the fused path only, among the enumerated
    configurations, and only when the consistent hypotheses were ``measured`` at full size: a
    verdict resting on predictions alone is said as such and is not a decision."""
    consistent = [h for h in hypotheses if h.consistent]
    summary = dimension_summary(hypotheses)
    tail = f" Among the enumerated configurations: {summary}" if summary else ""
    if not consistent:
        best = hypotheses[0] if hypotheses else None
        closest = f" The closest is {best.label()}: {best.why}." if best else ""
        return False, (f"Cannot decide: no enumerated configuration reproduces both readings within its tolerance."
                       f"{closest} Something not modelled differs (see the other causes below).")
    actives = {h.fused_active for h in consistent}
    if len(actives) == 2:
        return False, (f"Cannot decide whether the fused path was active: {len(consistent)} configurations fit, "
                       "some with it active, some without." + tail)
    state = "active" if actives == {True} else "NOT active"
    if not measured:
        return False, (f"The predictions point to the fused path {state} (every one of the {len(consistent)} "
                       "consistent configurations), but no full-size step confirmed it: a prediction, not a "
                       "decision." + tail)
    return True, (f"Every consistent configuration ({len(consistent)}, measured at full size) has the fused path "
                  f"{state}." + tail)
