"""Training parity: does a fused back-end train the model like eager torch does?

Each back-end trains its own copy of the model from the same initialisation on the same
batches (:class:`~fusedce_profiler.instrument.step.data.MarkovChain`) for ``steps`` AdamW steps. Two kinds of
evidence:

- **loss curves**: per-step ``|L_b − L_torch| / L_torch`` and the final loss (mean of the
  last tenth of the steps), which must agree within ``loss_tolerance``; and the torch run
  itself must learn (final loss below ``LEARN_FRACTION`` of the initial loss).
- **gradients along the trajectory**: at ``check_steps``, on the back-end's *own* current
  weights and batch, the gradients of the LM-head weight (which, tied, is the embedding and
  holds both contributions), its bias, and the hidden states, against eager torch in fp32
  (relative error ‖g − g_ref‖ / ‖g_ref‖), which must be within the mode's tolerance
  (:mod:`fusedce_profiler.instrument.tolerances`).

Training is often chaotic: two runs whose arithmetic differs by one rounding drift apart
exponentially (measured on the user's model in fp32: 1e-7 for 45 steps, 5% by step 64). So
by default a **control** runs first: torch again, from the initial weights multiplied by
``1 + u·z`` (``u`` the unit roundoff of the mode's compute dtype, ``z`` standard normal) —
torch's own math, one rounding away. Its final-loss gap to torch is the run's noise floor,
and a back-end's final loss fails only beyond ``max(loss_tolerance, NOISE_FACTOR × floor)``.
The gradient check, made on identical weights, is unaffected by the drift and stays the sharp
test of a wrongly wired loss.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fusedce_profiler.instrument import capacity, store
from fusedce_profiler.instrument.schema import build
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.precision import TRAINING_MODES, canonical_mode
from fusedce_profiler.instrument.tolerances import tolerance_for

REFERENCE = "torch"
CONTROL = "torch, perturbed"  # the noise-floor control (see the module docstring)
LEARN_FRACTION = 0.9  # the reference's final loss must be below 90% of its initial loss
# A back-end's final-loss gap may be this many times the control's: one control run samples
# the spread of chaotic trajectories once, and a second sample often lands twice as far.
NOISE_FACTOR = 3.0


@dataclass
class ParitySettings:
    """What to train. ``bias`` adds a (random) LM-head bias; ``ignore_frac`` pads batches."""

    config: ModelConfig
    backends: list[str]
    steps: int = 300
    batch: int = 8
    seq: int = 64
    lr: float = 3e-3
    device: str = "cpu"
    mode: str = "fp32"
    reduction: str = "mean"
    bias: bool = False
    ignore_frac: float = 0.0
    check_steps: list[int] | None = None
    loss_tolerance: float = 0.02
    seed: int = 0
    control: bool = True

    def __post_init__(self) -> None:
        if self.steps < 10:
            raise ValueError(f"steps must be at least 10 (the final loss averages the last tenth), got {self.steps}")
        self.mode = canonical_mode(self.mode, TRAINING_MODES)
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {self.reduction!r}")
        if not self.backends:
            raise ValueError("backends: give at least one back-end to compare with torch")
        if self.check_steps is None:
            self.check_steps = sorted({0, self.steps // 2, self.steps - 1})
        bad = [s for s in self.check_steps if not 0 <= s < self.steps]
        if bad:
            raise ValueError(f"check_steps {bad} are outside [0, steps={self.steps})")
        if self.bias and not self.config.lm_head_bias:
            self.config = dataclasses.replace(self.config, lm_head_bias=True)

    @property
    def grad_tolerance(self) -> float:
        return tolerance_for(self.mode)


@dataclass
class GradCheck:
    """Relative errors of one back-end's gradients at one step (``None``: no such tensor)."""

    step: int
    lm_head: float
    hidden: float
    bias: float | None = None


@dataclass
class ParityCurve:
    """One back-end's training run (``status`` as in model results; ``seconds``: its wall time,
    gradient checks included; ``None`` in runs recorded before it was stored)."""

    backend: str
    status: str = "ok"
    message: str = ""
    version: str = ""
    losses: list[float] = field(default_factory=list)
    grad_checks: list[GradCheck] = field(default_factory=list)
    seconds: float | None = None

    def final_loss(self) -> float:
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)

    def initial_loss(self) -> float:
        head = self.losses[:max(1, len(self.losses) // 10)]
        return sum(head) / len(head)

    def diverged_at(self) -> int | None:
        """The first step whose loss is not finite (NaN or ±∞: the run diverged there); ``None``
        when every loss is finite."""
        return next((step for step, loss in enumerate(self.losses) if not math.isfinite(loss)), None)

    def divergence(self) -> str | None:
        """:meth:`diverged_at` in words (``None`` when every loss is finite): the reason a run
        whose loss is not finite is never judged a pass."""
        step = self.diverged_at()
        return None if step is None else f"diverged: the loss is not finite from step {step}"


@dataclass
class ParityVerdict:
    """Pass/fail of one back-end against the torch run, with the numbers behind it."""

    backend: str
    passed: bool | None  # None: the back-end did not run (skipped)
    final_loss_rel_diff: float | None = None
    max_step_rel_diff: float | None = None
    max_step_rel_diff_step: int | None = None  # the step where max_step_rel_diff occurs
    worst_grad_error: float | None = None
    worst_grad_name: str | None = None
    reasons: list[str] = field(default_factory=list)
    loss_limit: float | None = None  # the final-loss limit applied (None in runs recorded before it)


@dataclass
class ParityReport:
    settings: ParitySettings
    curves: list[ParityCurve]
    verdicts: list[ParityVerdict]
    entropy_rate: float
    reference_learned: bool

    @property
    def passed(self) -> bool:
        """True when torch learned and no back-end that ran failed (the control is not judged);
        never when a loss curve diverged (:meth:`ParityCurve.diverged_at`), whatever was stored."""
        if any(c.diverged_at() is not None for c in self.curves if c.backend != CONTROL):
            return False
        return self.reference_learned and all(v.passed is not False for v in self.verdicts if v.backend != CONTROL)

    @property
    def noise_floor(self) -> float | None:
        """The control's final-loss gap to torch (``None`` without a finished control run)."""
        return next((v.final_loss_rel_diff for v in self.verdicts if v.backend == CONTROL), None)

    @property
    def not_run(self) -> list[str]:
        """Back-ends in the settings with no curve (a run cut short: see ``parity_training.run_parity``'s ``on_curve``)."""
        done = {c.backend for c in self.curves}
        return [b for b in self.settings.backends if b not in done]


def relative_difference(value: float, reference: float) -> float:
    """``|value − reference| / |reference|``: 0 for equal values, ∞ against a zero reference
    (never a ``ZeroDivisionError``; NaN when either is NaN)."""
    gap = abs(value - reference)
    if reference == 0:
        return 0.0 if gap == 0 else math.inf
    return gap / abs(reference)


@dataclass
class CurveGap:
    """How far one back-end's loss curve strays from torch's, step by step.

    ``diffs[i] = |L_b[i] − L_torch[i]| / |L_torch[i]|`` over the steps both runs have;
    ``peak_step`` is where the largest one occurs (the first such step on ties);
    ``above`` counts the steps where it exceeds ``threshold``, the first and last of them in
    ``first_above`` / ``last_above`` (``None`` when there are none); ``higher`` counts the
    steps where the back-end's loss is above torch's (about half of them when the two
    trajectories differ by rounding alone; nearly all or none for a systematic offset).
    """

    backend: str
    diffs: list[float]
    threshold: float
    peak: float
    peak_step: int
    above: int
    first_above: int | None
    last_above: int | None
    higher: int


def curve_gap(curve: ParityCurve, reference: ParityCurve, threshold: float) -> CurveGap | None:
    """The per-step relative gap of ``curve`` to ``reference``; ``None`` if either has no losses."""
    n = min(len(curve.losses), len(reference.losses))
    if n == 0:
        return None
    losses = torch.tensor(curve.losses[:n], dtype=torch.float64)
    ref = torch.tensor(reference.losses[:n], dtype=torch.float64)
    diffs = ((losses - ref).abs() / ref.abs()).tolist()
    finite = [(d, i) for i, d in enumerate(diffs) if math.isfinite(d)]
    peak, peak_step = max(finite, key=lambda item: (item[0], -item[1])) if finite else (math.nan, 0)
    over = [i for i, d in enumerate(diffs) if d > threshold]
    return CurveGap(curve.backend, diffs, threshold, peak, peak_step, len(over),
                    over[0] if over else None, over[-1] if over else None, int((losses > ref).sum()))


def judge(settings: ParitySettings, curve: ParityCurve, reference: ParityCurve,
          noise_floor: float | None = None) -> ParityVerdict:
    """Compare one back-end's run with the torch run (see the module docstring);
    ``noise_floor`` is the control's final-loss gap, if a control ran."""
    verdict = ParityVerdict(curve.backend, passed=None)
    if curve.status == "skipped":
        verdict.reasons.append(f"skipped: {curve.message}")
        return verdict
    if curve.status != "ok":
        verdict.passed = False
        verdict.reasons.append(f"{curve.status}: {curve.message}")
        return verdict
    if curve.divergence() is not None:
        verdict.passed = False
        verdict.reasons.append(curve.divergence())
        return verdict
    gap = curve_gap(curve, reference, settings.loss_tolerance)
    verdict.max_step_rel_diff, verdict.max_step_rel_diff_step = gap.peak, gap.peak_step
    verdict.final_loss_rel_diff = relative_difference(curve.final_loss(), reference.final_loss())
    verdict.loss_limit = settings.loss_tolerance
    if noise_floor is not None:
        verdict.loss_limit = max(settings.loss_tolerance, NOISE_FACTOR * noise_floor)
    if verdict.final_loss_rel_diff > verdict.loss_limit:
        why = (f"{settings.loss_tolerance:.0e}" if verdict.loss_limit == settings.loss_tolerance else
               f"{verdict.loss_limit:.2e} ({NOISE_FACTOR:g} × the perturbed-torch control's {noise_floor:.2e})")
        verdict.reasons.append(f"final loss {curve.final_loss():.4f} vs torch {reference.final_loss():.4f}: "
                               f"relative difference {verdict.final_loss_rel_diff:.2e} > {why}")
    worst = None
    for check in curve.grad_checks:
        for name in ("lm_head", "hidden", "bias"):
            value = getattr(check, name)
            if value is not None and (worst is None or not value <= worst[0]):
                worst = (value, f"{name} gradient at step {check.step}")
    if worst is not None:
        verdict.worst_grad_error, verdict.worst_grad_name = worst
        if not worst[0] <= settings.grad_tolerance:
            verdict.reasons.append(f"{worst[1]}: relative error {worst[0]:.2e} > {settings.grad_tolerance:.0e}")
    verdict.passed = not verdict.reasons
    return verdict


def save_parity_report(folder: Path, report: ParityReport) -> None:
    """Write the whole report to the folder's ``parity.json`` (strict JSON: a NaN loss is ``"NaN"``)."""
    store.write_json(Path(folder) / store.PARITY_FILE, dataclasses.asdict(report))


def load_parity_report(folder: Path) -> ParityReport:
    """The :class:`ParityReport` stored in a folder's ``parity.json``; ``ValueError`` if it is not one."""
    path = Path(folder) / store.PARITY_FILE
    raw = store.read_json(path)
    try:
        if isinstance(raw, dict) and isinstance(raw.get("settings"), dict):
            # runs recorded before the control existed had none
            raw = {**raw, "settings": {"control": False, **raw["settings"]}}
        report = build(ParityReport, raw)
        check_stored_report(report)
        return report
    except ValueError as exc:
        raise ValueError(f"{path}: not a parity report ({exc})") from None


def check_stored_report(report: ParityReport) -> None:
    """``ValueError`` naming the field of what :func:`~fusedce_profiler.judgements.parity_training.run_parity`
    never stores: no torch curve first (every run stores it before any other), a torch curve without
    losses or whose loss at step 0 is not above 0 (an untrained model's cross-entropy), a negative loss
    of torch or its control, more losses than steps (one per step), more curves or verdicts than the
    settings' back-ends give, more than ``parity.json`` can hold (the command refuses such a run before
    it trains: :func:`~fusedce_profiler.instrument.capacity.parity_problem`), an entropy rate above ln V,
    a final-loss tolerance outside (0, 1) (``--loss-tol``'s range)."""
    s = report.settings
    if not (math.isfinite(report.entropy_rate) and report.entropy_rate >= 0):  # the writer computes it from V
        raise ValueError(f"entropy_rate must be a finite number ≥ 0, got {report.entropy_rate!r}")
    if report.entropy_rate > math.log(s.config.vocab_size) * (1 + 1e-9):  # a chain over V tokens: at most ln V
        raise ValueError(f"entropy_rate must be at most ln V = {math.log(s.config.vocab_size):.3f}, "
                         f"got {report.entropy_rate!r}")
    if not report.curves or report.curves[0].backend != REFERENCE:
        raise ValueError(f"curves: the first curve must be the {REFERENCE} reference (every run stores it first), got "
                         + (repr(report.curves[0].backend[:80]) if report.curves else "no curve"))
    if not report.curves[0].losses:
        raise ValueError(f"curves[0].losses: the {REFERENCE} reference has no loss (a run stores one per step)")
    if not report.curves[0].losses[0] > 0:  # an untrained model's cross-entropy: about ln V
        raise ValueError(f"curves[0].losses[0]: torch's loss at step 0 must be above 0, got {report.curves[0].losses[0]!r}")
    if not 0 < s.loss_tolerance < 1:
        raise ValueError(f"settings.loss_tolerance must be in (0, 1), got {s.loss_tolerance!r}")
    for index, curve in enumerate(report.curves):
        if curve.backend in (REFERENCE, CONTROL) and any(loss < 0 for loss in curve.losses):
            raise ValueError(f"curves[{index}].losses: torch's cross-entropy is never negative, got "
                             f"{min(curve.losses)!r}")
        if len(curve.losses) > s.steps:
            raise ValueError(f"curves[{index}].losses: {len(curve.losses):,} losses, more than settings.steps "
                             f"({s.steps:,}; one per step)")
    runs = 1 + bool(s.control) + len([b for b in s.backends if b != REFERENCE])
    if len(report.curves) > runs:
        raise ValueError(f"curves: {len(report.curves):,} curves, more than the {runs:,} the settings train "
                         "(torch, the control, each of settings.backends)")
    if len(report.verdicts) > len(report.curves) - 1:
        raise ValueError(f"verdicts: {len(report.verdicts):,} verdicts for {len(report.curves) - 1:,} compared curves")
    if capacity.parity_problem(runs, s.steps) is not None:
        raise ValueError(f"settings.backends: {runs:,} training runs of {s.steps:,} steps would not fit "
                         f"{store.PARITY_FILE}'s size limit: the parity command refuses such a run before it trains")
