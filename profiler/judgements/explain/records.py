"""``explain``: which configurations are consistent with two ``nvidia-smi`` readings a user saw.

The user reports a naive and a fused reading (MiB), the card's memory and whatever else they
know (B, T, attention implementation, tie, checkpointing, precision, an evaluation pass). What
they did not state is enumerated as **families** (:class:`Family`: attention × tie ×
checkpointing × evaluation pass × T). For each family the torch step and the fused step are
*measured* at a few small batch sizes (:class:`Calibration`): every phase of the step
(forward, loss, backward, optimizer) gets its own line in B, and the step's predicted peak is
the maximum over those lines (:mod:`~fusedce_profiler.judgements.explain.calibration`). The
``nvidia-smi`` figure adds what the caching allocator keeps above the allocated peak and the
CUDA context of the user's card (:mod:`~fusedce_profiler.judgements.explain.tolerance`).

Each family gives **hypotheses** (:class:`Hypothesis`): the batch size whose predicted naive
reading is nearest the naive reading, with the fused path active or not. The naive reading
pins B; the *saving* (naive − fused) is what separates the families, since the context and
most of the model cancel in it. A hypothesis is *consistent* when both the naive reading and
the saving are within their tolerances (each made of named terms, :class:`Tolerance`) and the
step fits the card (:mod:`~fusedce_profiler.judgements.explain.verdict`).

Everything is plain dataclasses stored as ``explain.json`` by :func:`save_explanation`; the
Markdown is rendered by :mod:`fusedce_reports.explain_report`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.schema import build

MIB = 1 << 20
GIB = 1 << 30
DIMENSIONS = ("fused_active", "attention", "checkpointing", "eval_step", "tied", "seq", "batch")
PHASES = ("forward", "loss", "backward", "optimizer")
"""The phases of a measured step (:mod:`fusedce_profiler.instrument.step.step`), in order."""


@dataclass
class Observation:
    """What the user saw and knows (``None``: not stated, to be enumerated).

    ``naive_mib`` / ``fused_mib``: ``nvidia-smi`` readings (MiB) with the naive and the fused
    loss; ``total_gib``: the card's memory (GiB); ``context_mib``: the CUDA context of the
    user's card if stated (MiB), else the measured one with its uncertainty; ``fused_larger``:
    the user says the fused reading really was the larger one.
    """

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
    context_mib: float | None = None
    fused_larger: bool = False


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
    """Measured steps of one back-end in one family at ``batches`` (all figures bytes).

    ``phase_peaks[name][i]``: the allocated peak of phase ``name`` at ``batches[i]``
    (``None`` where the step failed); ``reserved[i]``: the allocator's peak reserved (CUDA);
    ``context[i]``: the CUDA context measured beside it; ``static[i]``: the bytes allocated when
    the step starts (parameters, optimizer state, batch); ``lines[name]``: (intercept, slope)
    of the phase's least-squares line in B, fitted by
    :func:`~fusedce_profiler.judgements.explain.calibration.fit_lines`.
    """

    family: Family
    backend: str
    batches: list[int]
    statuses: list[str]
    phase_peaks: dict[str, list[int | None]] = field(default_factory=dict)
    reserved: list[int | None] = field(default_factory=list)
    context: list[int | None] = field(default_factory=list)
    static: list[int | None] = field(default_factory=list)
    lines: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def figures(self) -> list[int | None]:
        """The step's allocated peak at each calibration batch (max over phases)."""
        out = []
        for i in range(len(self.batches)):
            values = [v[i] for v in self.phase_peaks.values() if v[i] is not None]
            out.append(max(values) if values else None)
        return out

    @property
    def fitted(self) -> bool:
        return bool(self.lines)

    def predict_phases(self, batch: float, extra_activations: float = 0.0) -> dict[str, float]:
        """Each phase's predicted allocated peak (bytes) at ``batch``.

        ``extra_activations``: bytes per sample that another implementation of the same model
        keeps beyond ours. They are alive through the forward, the loss and the start of the
        backward phase, so those three lines move by ``extra_activations`` · B; the optimizer
        step runs after they are freed."""
        shift = extra_activations * batch
        return {name: a + b * batch + (shift if name != "optimizer" else 0.0) for name, (a, b) in self.lines.items()}

    def predict(self, batch: float, extra_activations: float = 0.0) -> tuple[float, str] | None:
        """(allocated peak in bytes, the phase holding it) at ``batch``: the maximum over phases."""
        if not self.lines:
            return None
        phases = self.predict_phases(batch, extra_activations)
        name = max(phases, key=phases.get)
        return phases[name], name


@dataclass
class Tolerance:
    """Allowed differences (bytes) between a prediction and a reading, term by term.

    ``noise``: run-to-run spread of a repeated reading (measured); ``model``: the model-mismatch
    allowance (a fraction of the predicted step; larger for a stand-in preset); ``context``:
    uncertainty of the user's CUDA context; ``allocator``: uncertainty of what the caching
    allocator keeps above the allocated peak (spread of the measured reserved/allocated
    ratios). The naive reading is allowed all four; the saving (naive − fused) twice the noise
    plus the model and allocator terms of the saving only (the context cancels in it).
    """

    noise: float
    model: float
    context: float
    allocator: float

    @property
    def total(self) -> float:
        return self.noise + self.model + self.context + self.allocator

    def describe(self) -> str:
        return (f"±{self.total / MIB:,.0f} MiB = noise {self.noise / MIB:,.0f} + model {self.model / MIB:,.0f} + "
                f"context {self.context / MIB:,.0f} + allocator {self.allocator / MIB:,.0f}")


@dataclass
class Hypothesis:
    """One configuration: family, batch, fused path active or not, and its predictions (bytes).

    ``predicted_*``: the readings it predicts (``nvidia-smi`` on a GPU, allocated peak on the
    CPU); ``peak_phase_*``: the phase holding each step's peak; ``error_naive``: predicted −
    seen naive reading; ``error_saving``: predicted − seen saving (bytes); ``score``: the larger
    of the two errors in units of their tolerances (≤ 1: consistent); ``batch_range``: the
    batch sizes whose naive prediction is within tolerance, ``saving_range`` the savings (bytes)
    predicted over them; ``capped``: the naive step's
    reserved bytes would pass the card, so the allocator frees its cache and retries;
    ``allocated_naive`` / ``allocated_fused``: the steps' predicted allocated peaks (bytes);
    ``extra_activations``: bytes per token the user's implementation keeps beyond the model's at
    the best fit (0 for the user's own model).
    """

    family: Family
    batch: int
    fused_active: bool
    predicted_naive: float
    predicted_fused: float
    error_naive: float
    error_saving: float
    tolerance_naive: Tolerance
    tolerance_saving: Tolerance
    consistent: bool
    why: str
    peak_phase_naive: str = ""
    peak_phase_fused: str = ""
    batch_range: tuple[int, int] | None = None
    saving_range: tuple[float, float] | None = None
    capped: bool = False
    allocated_naive: float = 0.0
    allocated_fused: float = 0.0
    measured_naive: int | None = None
    measured_fused: int | None = None
    alloc_retries: int | None = None
    extra_activations: float = 0.0

    @property
    def score(self) -> float:
        return max(abs(self.error_naive) / max(self.tolerance_naive.total, 1.0),
                   abs(self.error_saving) / max(self.tolerance_saving.total, 1.0))

    @property
    def predicted_saving(self) -> float:
        return self.predicted_naive - self.predicted_fused

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
    """The one measurement that splits the consistent hypotheses: the command, and what each
    outcome predicts (``predictions``: (outcome, figure, unit) — figures that differ)."""

    dimension: str
    command: str
    predictions: list[tuple[str, float, str]]
    sentence: str


@dataclass
class OtherHypothesis:
    """A cause outside the enumerated step (another process on the GPU, both runs capped by the
    card, …): whether the readings allow it, and the numbers that say so."""

    name: str
    consistent: bool
    why: str


@dataclass
class Explanation:
    """``explain``'s inputs, measurements and conclusions (what ``explain.json`` holds).

    ``prediction_only``: nothing was measured on the user's kind of device (the CPU): the
    hypotheses are ranked by predictions and no verdict is given; ``interrupted``: the run
    stopped before its end (the calibrations hold what finished); ``confirmations``: the
    measured prediction error of every full-size step, as sentences; ``failed_backends``: each
    back-end whose every calibration step failed (an error or a time-out, never an OOM) → the
    first such step's message — nothing is judged then (no hypothesis reasons on failed steps);
    ``failed_steps``: a sentence for each back-end some of whose calibration steps failed while
    others finished (how many, the first's message): the judgement rests on those that finished.
    """

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
    others: list[OtherHypothesis] = field(default_factory=list)
    confirmations: list[str] = field(default_factory=list)
    ruled_out_families: list[str] = field(default_factory=list)
    prediction_only: bool = False
    interrupted: bool = False
    failed_backends: dict[str, str] = field(default_factory=dict)
    failed_steps: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> list[Hypothesis]:
        return [h for h in self.hypotheses if h.consistent]

    @property
    def consistent_families(self) -> int:
        """Distinct (family, fused path) pairs among the consistent hypotheses."""
        return len({(h.family, h.fused_active) for h in self.consistent})


def save_explanation(folder: Path, explanation: Explanation) -> Path:
    return store.write_json(Path(folder) / store.EXPLAIN_FILE, dataclasses.asdict(explanation))


def load_explanation(folder: Path) -> Explanation:
    """The folder's stored explanation; ``ValueError`` in one line when ``explain.json`` was
    written in another layout (an earlier version of ``explain``)."""
    raw = store.read_json(Path(folder) / store.EXPLAIN_FILE)
    try:
        return explanation_from_dict(raw)
    except ValueError as exc:
        raise ValueError(f"{Path(folder) / store.EXPLAIN_FILE}: not an explanation this version can read ({exc}); "
                         "run explain again") from None


def explanation_from_dict(raw: dict) -> Explanation:
    """A stored explanation, every field checked against its dataclass
    (:func:`~fusedce_profiler.instrument.schema.build`: ``ValueError`` naming the field), and its
    readings as ``explain`` takes them: finite and above 0 (it refuses ``--card 0`` or a NaN reading
    before anything runs)."""
    explanation = build(Explanation, raw)
    o = explanation.observation
    for name in ("naive_mib", "fused_mib", "total_gib"):
        if not (math.isfinite(getattr(o, name)) and getattr(o, name) > 0):
            raise ValueError(f"observation.{name} must be a finite number above 0, got {getattr(o, name)!r}")
    if o.context_mib is not None and not (math.isfinite(o.context_mib) and o.context_mib >= 0):
        raise ValueError(f"observation.context_mib must be a finite number ≥ 0, got {o.context_mib!r}")
    return explanation
