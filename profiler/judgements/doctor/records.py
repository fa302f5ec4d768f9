"""What ``doctor`` stores: the checks it makes (:data:`CHECKS`), one :class:`Check` per item and the
:class:`DoctorRun` written as ``doctor.json``.

Public API: :data:`VERDICTS`, :data:`CHECKS`, :data:`ITEMS`, :class:`Check`, :class:`DoctorRun`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fusedce_profiler.instrument.models.head import HeadInfo
from fusedce_profiler.instrument.schema import build, checked_fields
from fusedce_profiler.judgements.doctor.precision import Spread

VERDICTS = ("pass", "fail", "unclear", "not checked", "n/a")

#: (key, item, depends on): every check, in the order they are reported.
CHECKS = (
    ("runs", "the loss runs on a padded batch", ()),
    ("tie", "declared tie honoured by the head's forward", ()),
    ("weight", "the loss multiplies by the parameter the head trains", ("runs",)),
    ("body", "gradient reaches the body", ("runs",)),
    ("norm", "final norm applied", ("runs", "body")),
    ("bias", "bias as the head has it", ("runs",)),
    ("transform", "the model's logit transform (soft-cap) applied", ("runs", "weight")),
    ("shift", "targets shifted (position t predicts labels[t+1])", ("runs", "body")),
    ("ignore", "padding (-100) ignored", ("runs", "weight", "body", "shift")),
    ("options", "the config's loss options applied (z-loss, label smoothing)",
     ("runs", "weight", "body", "norm", "bias", "transform", "shift", "ignore")),
    ("reduction", "mean over the labelled tokens (no sum, no extra scaling)",
     ("runs", "weight", "body", "norm", "bias", "transform", "shift", "ignore", "options")),
    ("loss", "loss matches the naive loss", ("runs", "weight", "body", "norm", "bias", "transform", "shift",
                                             "ignore", "options", "reduction")),
    ("gradient", "gradients match the naive loss's", ("runs", "weight", "body", "norm", "bias", "transform",
                                                      "shift", "ignore", "options", "reduction")),
    ("call", "the weight at the call is usable (no empty shard, no DTensor mixed with plain tensors)", ()),
    ("fresh", "the loss follows the head's weight after an in-place step (no copy made once)", ("runs", "body", "shift")),
    ("accumulation", "gradient accumulation over uneven micro-batches matches the whole batch", ("runs", "reduction")),
    ("all-ignored", "an all-ignored micro-batch gives finite, zero gradients", ("runs", "ignore")),
    ("none", "reduction='none' keeps ignored rows at 0 and their gradients", ("runs", "ignore")),
    ("compile", "torch.compile gives the eager loss and gradients with ignored targets", ("runs",)),
    ("eval", "the same path in evaluation (no fallback to materialised logits)", ("runs",)),
    ("precision", "grad_W accumulated at fp32 accuracy",
     ("runs", "weight", "body", "norm", "bias", "transform", "shift", "ignore", "reduction", "loss")),
)
#: key → the item's sentence.
ITEMS = {key: item for key, item, _ in CHECKS}


@dataclass
class Check:
    """One doctor item: ``key`` (see :data:`CHECKS`), ``item`` (its sentence), ``verdict``
    (one of :data:`VERDICTS`), ``evidence`` (the numbers), ``depends_on`` (keys)."""

    item: str
    verdict: str
    evidence: str
    key: str = ""
    depends_on: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")


@dataclass
class DoctorRun:
    """What ``doctor`` stores as ``doctor.json``: the ``--loss`` checked, the model (``config``:
    its name; ``model``: the source), where and how it ran, the located head, the loss values
    (``losses``: yours, the reference and each known mistake's), and the checks in order."""

    loss: str
    config: str
    checks: list[Check]
    model: str = ""
    device: str = "cpu"
    mode: str = "fp32"
    tolerance: float = 0.0
    batch: int = 0
    seq: int = 0
    parameters: int = 0
    head: dict | None = None  # a :class:`~fusedce_profiler.instrument.models.head.HeadInfo`
    losses: dict[str, float | None] = field(default_factory=dict)
    spread: dict = field(default_factory=dict)  # :class:`~fusedce_profiler.judgements.doctor.precision.Spread`
    options: dict = field(default_factory=dict)  # the config's loss options (name → value)
    rank: int = 0
    world_size: int = 1
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        """Every item judged and none failed (``unclear``, ``not checked`` and ``n/a`` are not
        failures); an interrupted run, or one without checks, has no verdict and did not pass."""
        return bool(self.checks) and not self.interrupted and not any(c.verdict == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> "DoctorRun":
        """Validate a stored run, every field checked (:func:`~fusedce_profiler.instrument.schema.build`;
        ``head`` and ``spread`` against the records they were stored from); a bare list of checks is
        read as a run whose loss and config are unknown."""
        if isinstance(raw, list):
            raw = {"loss": "", "config": "", "checks": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"doctor.json must hold an object, got {type(raw).__name__}")
        run = build(cls, raw)
        if run.head:
            run.head = checked_fields(HeadInfo, run.head, "head")
        if run.spread:
            run.spread = checked_fields(Spread, run.spread, "spread")
        run.check_values()
        return run

    def check_values(self) -> None:
        """``ValueError`` naming the field of a number ``doctor`` never stores: a negative size or count,
        a tolerance or a measured spread that is NaN or negative (the writer computes them as relative
        errors, at least the fp32 floor; an overflowing low-precision loss can make one infinite)."""
        for name in ("batch", "seq", "parameters", "rank"):
            _at_least(getattr(self, name), 0, name)
        _at_least(self.world_size, 1, "world_size")
        _non_negative(self.tolerance, "tolerance")
        if self.spread:
            _at_least(self.spread["samples"], 0, "spread.samples")
            for name in ("loss", "gradient", "tolerance", "floor", "loss_tolerance"):
                if name in self.spread:
                    _non_negative(self.spread[name], f"spread.{name}")
            for group, value in (self.spread.get("groups") or {}).items():
                _non_negative(value, f"spread.groups.{group[:80]}")


def _at_least(value: int, low: int, name: str) -> None:
    if not value >= low:
        raise ValueError(f"{name} must be at least {low}, got {value!r}")


def _non_negative(value: float, name: str) -> None:
    if not value >= 0:  # NaN too
        raise ValueError(f"{name} must be a number ≥ 0, got {value!r}")
