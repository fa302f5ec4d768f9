"""``explain``'s conclusion: what the consistent hypotheses say together (per dimension: settled,
open, ruled out) and the one ``fusedce-profile model`` run that would split those that remain.
"""
from __future__ import annotations

from fusedce_profiler.judgements.explain.records import DIMENSIONS, GIB, Hypothesis, Observation, Separation


def _option(dimension: str, value, model_args: str) -> str:
    if dimension == "attention":
        return f"--attention {value}"
    if dimension == "checkpointing":
        return "--checkpointing" if value else ""
    if dimension == "eval_step":
        return "--eval-step" if value else ""
    if dimension == "tied":
        return "--tied" if value else "--untied"
    return ""


def separating_measurement(hypotheses: list[Hypothesis], obs: Observation, model_args: str) -> Separation | None:
    """The first dimension (in :data:`DIMENSIONS` order) on which the consistent hypotheses
    differ, and the run of ``fusedce-profile model`` that tells its values apart."""
    consistent = [h for h in hypotheses if h.consistent]
    if len(consistent) < 2:
        return None
    for dimension in DIMENSIONS:
        values = list(dict.fromkeys(h.value(dimension) for h in consistent))
        if len(values) < 2:
            continue
        best = {v: next(h for h in consistent if h.value(dimension) == v) for v in values}
        ref = consistent[0]
        fam = ref.family
        parts = [f"fusedce-profile model {model_args}", f"--batch {ref.batch}", f"--seq {fam.seq}",
                 f"--attention {fam.attention}", _option("checkpointing", fam.checkpointing, model_args),
                 _option("eval_step", fam.eval_step, model_args), _option("tied", fam.tied, model_args)]
        if dimension == "fused_active":
            parts.append("--backend YOUR_LOSS_MODULE:callable")
            command = " ".join(p for p in parts if p)
            active, inactive = best.get(True), best.get(False)
            predictions = [("fused path active", active.predicted_fused), ("fused path not active",
                                                                             inactive.predicted_fused)]
            sentence = (f"run `{command}` with your own loss wrapper: if the fused path is active the logits "
                        f"detector finds no N×V tensor kept for backward and the step shows ~"
                        f"{active.predicted_fused / GIB:.1f} GiB; if it is not, the detector names the line that "
                        f"materialises the logits and the step shows ~{inactive.predicted_fused / GIB:.1f} GiB")
            return Separation(dimension, command, predictions, sentence)
        parts = [p for p in parts if not p.startswith(_prefix(dimension))] + [f"--backend {obs.fused_backend}"]
        base_cmd = " ".join(p for p in parts if p)
        options = {v: _option(dimension, v, model_args) for v in values}
        predictions = [(f"{dimension}={v}", best[v].predicted_fused) for v in values]
        outcomes = "; ".join(f"with `{options[v] or f'no --{dimension.replace(chr(95), chr(45))}'}` "
                             f"({dimension}={v}) ~{best[v].predicted_fused / GIB:.1f} GiB" for v in values)
        first = values[0]
        command = f"{base_cmd} {options[first]}".strip()
        sentence = (f"the consistent hypotheses differ in {dimension}: run `{command}` and compare the fused step "
                    f"with the reading — {outcomes} — or check your training script for that setting")
        return Separation(dimension, command, predictions, sentence)
    return None


def _prefix(dimension: str) -> str:
    return {"attention": "--attention", "checkpointing": "--checkpointing", "eval_step": "--eval-step",
            "tied": "--tied", "seq": "--seq", "batch": "--batch"}.get(dimension, "--")


def _shown(dimension: str, value) -> str:
    if dimension == "fused_active":
        return "fused path active" if value else "fused path NOT active"
    if dimension == "seq":
        return f"T={value}"
    if isinstance(value, bool):
        return dimension.replace("_", " ") + (" on" if value else " off")
    return f"{dimension.replace('_', ' ')} {value}"


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
    batches = sorted({h.batch for h in consistent})
    parts = [f"consistent batch sizes: {batches[0]}" + (f"–{batches[-1]}" if len(batches) > 1 else "")]
    if settled:
        parts.append("every consistent hypothesis has " + ", ".join(settled))
    if open_:
        parts.append("still open: " + "; ".join(open_))
    if ruled:
        parts.append("ruled out (no consistent hypothesis has it): " + ", ".join(ruled))
    return "; ".join(parts) + "."


def conclude(hypotheses: list[Hypothesis], obs: Observation) -> tuple[bool, str]:
    """(decided, sentence): what the consistent hypotheses say together, and per dimension
    which values they settle, leave open or rule out (:func:`dimension_summary`). "Decided"
    is about the fused path only and only among the enumerated configurations."""
    decided, sentence = _verdict(hypotheses, obs)
    summary = dimension_summary(hypotheses)
    return decided, sentence + (f" Among the enumerated configurations: {summary}" if summary else "")


def _verdict(hypotheses: list[Hypothesis], obs: Observation) -> tuple[bool, str]:
    consistent = [h for h in hypotheses if h.consistent]
    if not consistent:
        best = hypotheses[0] if hypotheses else None
        closest = f" The closest is {best.label()}: {best.why}." if best else ""
        return False, (f"Cannot decide: no enumerated configuration reproduces both readings within "
                       f"±{obs.tolerance:.0%}.{closest} Something not modelled differs (another process on the GPU, "
                       "a different model or sequence length, pinned DataLoader memory, an earlier larger batch).")
    actives = {h.fused_active for h in consistent}
    if actives == {False}:
        return True, (f"Every consistent configuration ({len(consistent)}) has the fused path NOT active: with it "
                      "active, no enumerated configuration predicts readings this close to each other (one outside "
                      "the enumeration could).")
    if actives == {True}:
        return True, (f"Every consistent configuration ({len(consistent)}) has the fused path active: the saving is "
                      "this small because the LM head and loss were a small part of the step's peak there (a "
                      "configuration outside the enumeration could still fit with it inactive).")
    return False, (f"Cannot decide whether the fused path was active: {len(consistent)} configurations fit, some with "
                   "it active (the logits were not the peak), some without.")
