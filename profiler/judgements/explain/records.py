"""``explain``: which configurations are consistent with two ``nvidia-smi`` readings a user saw.

The user reports a naive and a fused reading (MiB), the card's memory and whatever else they
know (B, T, attention implementation, tie, checkpointing, precision, an evaluation pass). What
they did not state is enumerated as **families** (:class:`Family`: attention × tie ×
checkpointing × evaluation pass × T). For each family the torch step and the fused step are
*measured* at a few small batch sizes (:class:`Calibration`, run and fitted linearly in B by
:mod:`fusedce_profiler.judgements.explain.calibration`) — the predictions are those lines, not
formulas. Each family then gives **hypotheses**
(:class:`Hypothesis`): the batch sizes whose predicted naive figure is nearest the naive
reading, with the fused path active (the fused line) or not (the fused step behaves like
torch's). A hypothesis is *consistent* when both predicted figures are within the tolerance
of the readings and the step fits the card; otherwise it is *ruled out*, with the numbers
(:mod:`fusedce_profiler.judgements.explain.verdict`). On a GPU the closest hypotheses are then run at
full size (``confirmed``); on the CPU the figures are peak allocated bytes (no allocator cache,
no CUDA context) and nothing can be confirmed. :mod:`fusedce_profiler.judgements.explain.conclusion`
says what the consistent hypotheses settle together and names the one run that would split
those that remain (:class:`Separation`), with its predicted outcome under each.

Everything is plain dataclasses stored as ``explain.json`` by :func:`save_explanation`; the
Markdown is rendered by :mod:`fusedce_reports.explain_report`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fusedce_profiler.instrument import store

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
        # named as ``explain`` takes them, since that is where a bad value comes from
        for name, option in (("naive_mib", "--naive"), ("fused_mib", "--fused"), ("total_gib", "--card")):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{option} must be a positive number, got {value!r}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"--tolerance must be in (0, 1), got {self.tolerance}")


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
