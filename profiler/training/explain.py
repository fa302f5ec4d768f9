"""``explain``: which configurations are consistent with two ``nvidia-smi`` readings a user saw.

The user reports a naive and a fused reading (MiB), the card's memory and whatever else they
know (B, T, attention implementation, tie, checkpointing, precision, an evaluation pass). What
they did not state is enumerated as **families** (:class:`Family`: attention × tie ×
checkpointing × evaluation pass × T). For each family the torch step and the fused step are
*measured* at a few small batch sizes (:class:`Calibration`) and fitted linearly in B — the
predictions are those lines, not formulas. Each family then gives **hypotheses**
(:class:`Hypothesis`): the batch sizes whose predicted naive figure is nearest the naive
reading, with the fused path active (the fused line) or not (the fused step behaves like
torch's). A hypothesis is *consistent* when both predicted figures are within the tolerance
of the readings and the step fits the card; otherwise it is *ruled out*, with the numbers.
On a GPU the closest hypotheses are then run at full size (``confirmed``); on the CPU the
figures are peak allocated bytes (no allocator cache, no CUDA context) and nothing can be
confirmed. :func:`separating_measurement` names the one run that would split the consistent
hypotheses that remain, with its predicted outcome under each.

Everything is plain dataclasses stored as ``explain.json`` by :func:`save_explanation`; the
Markdown is rendered by :mod:`reports.explain_report`.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from profiler import store
from profiler.training.jobs import ModelJob, ModelResult

MIB = 1 << 20
GIB = 1 << 30
DIMENSIONS = ("fused_active", "attention", "checkpointing", "eval_step", "tied", "seq", "batch")


@dataclass
class Observation:
    """What the user saw and knows (``None``: not stated, to be enumerated)."""

    naive_mib: float
    fused_mib: float
    total_gib: float
    batch: int | None = None
    seq: int | None = None
    attention: str | None = None
    tied: bool | None = None
    checkpointing: bool | None = None
    eval_step: bool | None = None
    fused_active: bool | None = None
    mode: str = "amp-bf16"
    fused_backend: str = "fusedce"
    tolerance: float = 0.05

    def __post_init__(self) -> None:
        for name in ("naive_mib", "fused_mib", "total_gib"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")


@dataclass(frozen=True)
class Family:
    """The configuration dimensions that change the step's memory, batch aside."""

    attention: str
    tied: bool
    checkpointing: bool
    eval_step: bool
    seq: int

    def label(self) -> str:
        return (f"{self.attention}, {'tied' if self.tied else 'untied'}, "
                f"{'checkpointing' if self.checkpointing else 'no checkpointing'}, "
                f"{'eval pass first' if self.eval_step else 'no eval pass'}, T={self.seq}")


@dataclass
class Calibration:
    """Measured figures (bytes) of one back-end in one family at ``batches``, and their line."""

    family: Family
    backend: str
    batches: list[int]
    figures: list[int | None]
    statuses: list[str]
    intercept: float | None = None
    slope: float | None = None

    def predict(self, batch: int) -> float | None:
        if self.slope is None:
            return None
        return self.intercept + self.slope * batch


@dataclass
class Hypothesis:
    """One configuration: family, batch, fused path active or not, and its predictions (bytes)."""

    family: Family
    batch: int
    fused_active: bool
    predicted_naive: float
    predicted_fused: float
    error_naive: float
    error_fused: float
    consistent: bool
    why: str
    measured_naive: int | None = None
    measured_fused: int | None = None

    @property
    def score(self) -> float:
        return max(abs(self.error_naive), abs(self.error_fused))

    def value(self, dimension: str):
        if dimension == "fused_active":
            return self.fused_active
        if dimension == "batch":
            return self.batch
        return getattr(self.family, dimension)

    def label(self) -> str:
        return (f"B={self.batch}, {self.family.label()}, fused path "
                f"{'active' if self.fused_active else 'NOT active'}")


@dataclass
class Separation:
    """The one measurement that splits the consistent hypotheses, and what each predicts."""

    dimension: str
    command: str
    predictions: list[tuple[str, float]]
    sentence: str


@dataclass
class Explanation:
    """``explain``'s inputs, measurements and conclusions (what ``explain.json`` holds)."""

    observation: Observation
    model: str
    source: dict | None
    device: str
    metric: str
    calibrations: list[Calibration]
    hypotheses: list[Hypothesis]
    separation: Separation | None
    decided: bool
    conclusion: str
    confirmed: bool
    notes: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> list[Hypothesis]:
        return [h for h in self.hypotheses if h.consistent]


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


def save_explanation(folder: Path, explanation: Explanation) -> Path:
    return store.write_json(Path(folder) / store.EXPLAIN_FILE, dataclasses.asdict(explanation))


def load_explanation(folder: Path) -> Explanation:
    raw = store.read_json(Path(folder) / store.EXPLAIN_FILE)
    return explanation_from_dict(raw)


def explanation_from_dict(raw: dict) -> Explanation:
    raw = dict(raw)
    raw["observation"] = Observation(**raw["observation"])
    fam = lambda f: Family(**f)  # noqa: E731
    raw["calibrations"] = [Calibration(**{**c, "family": fam(c["family"])}) for c in raw["calibrations"]]
    raw["hypotheses"] = [Hypothesis(**{**h, "family": fam(h["family"])}) for h in raw["hypotheses"]]
    if raw.get("separation") is not None:
        sep = dict(raw["separation"])
        sep["predictions"] = [tuple(p) for p in sep["predictions"]]
        raw["separation"] = Separation(**sep)
    return Explanation(**raw)
