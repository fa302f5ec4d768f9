"""From a step's allocated peak to what ``nvidia-smi`` shows on the user's card, with the
tolerance of each term.

``nvidia-smi`` (one process) = CUDA context + the caching allocator's reserved bytes. At the
step's peak the allocator holds the allocated peak plus *slack*: blocks cached from earlier
phases and steps that the peak's requests could not reuse. The blocks that are freed and
requested again in a training step with the naive loss are dominated by the head's buffers —
bf16 logits (L = B·T·V·2 bytes), their fp32 copy and log-softmax (2L each), the logits'
gradient — so the slack is measured in units of L (:func:`slack_ranges`): over every calibration
step of a back-end on this GPU, the smallest and largest ``(reserved − allocated) / L`` bound it.
The prediction takes the middle of that range and the allocator tolerance half its width; how
many steps ran and what ran before them (an evaluation pass, Lightning's sanity check) moves a
reading within it.

The model itself is a second source of spread: another implementation of the same
architecture keeps more activations per token (Hugging Face's GPT-2 keeps up to 34.5 bytes per
token, layer and hidden unit more than the built-in model on an H200, :data:`IMPLEMENTATION_SPREAD`: its tanh
GELU's and its attention's intermediates), while the attention's T² scores and the head's bytes
do not depend on it. So a stand-in's prediction is a range over these *extra activations*
(:meth:`~fusedce_profiler.judgements.explain.records.Calibration.predict_phases`), shared by the
naive and the fused step of one hypothesis: they move the naive reading, and cancel in the
saving.

Near the card's limit the allocator behaves differently: when a ``cudaMalloc`` fails it frees
its cached blocks and retries (``num_alloc_retries``), so reserved never passes the card minus
the context. A step whose allocated peak fits but whose predicted reserved does not is *capped*:
the reading lies between context + allocated peak and the card itself (:func:`predict_reading`).

The context differs by GPU class (hundreds of MiB between a consumer card and an H200): the
user's stated ``--context-mib`` is used when given; otherwise the context measured here, with
:data:`UNKNOWN_CONTEXT_SPREAD` as its uncertainty.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from fusedce_profiler.judgements.explain.records import GIB, MIB, Calibration, Observation, Tolerance

UNKNOWN_CONTEXT_SPREAD = 250 * MIB
"""Uncertainty of the user's CUDA context when they do not state it (bytes): contexts of
different GPU classes and drivers differ by a few hundred MiB."""
STATED_CONTEXT_SPREAD = 16 * MIB
"""Uncertainty of a context the user measured and stated (nvidia-smi rounds to MiB)."""
STAND_IN_MISMATCH = 0.04
"""Model-mismatch allowance (fraction of the predicted step) when the model is a stand-in
preset for the user's own implementation (same shapes, different code), beside the activation
scale's range: parameters, optimizer state and the loss's own code."""
IMPLEMENTATION_SPREAD = 34.5
"""Activations a second implementation of the stand-in's architecture keeps beyond the built-in
model's, in bytes per token, layer and hidden unit: Hugging Face ``GPT2LMHeadModel`` at the
``user-gpt`` preset's shapes (12 layers, H=768, FFN 2304, V=32777) against the built-in model,
slope in B of each phase's allocated peak (B=2 and 4, amp-bf16), the largest over the forward, loss
and backward phases (``benchmarks/explain_implementation_spread.py``). Measured on an H200 at T=512,
1024 and 2048: eager 30.3–31.6, SDPA 32.7–34.5 (``benchmarks/results/explain-implementation-spread-h200-2026-12-04/``);
on the CPU at T=128 the same pair differs by only 22.7 (eager) and 14.6 (SDPA), so the GPU's largest
is kept for both. A stand-in's extra activations range over [0, spread · layers · H] per token: an
implementation outside the measured spread is not covered, and naming it (``--model``/``--hf``)
measures it."""
EXTRA_ACTIVATION_POINTS = 9
"""Points of the extra-activation range tried per batch size (evenly spaced, both ends included)."""
OWN_MODEL_MISMATCH = 0.01
"""Model-mismatch allowance when the model is the user's own (``--model``, ``--hf``, ``--config``)."""
ALLOCATOR_ALLOWANCE = 0.02
"""Allowance for the allocator's slack beyond its fitted line, as a fraction of the allocated peak."""
READING_RESOLUTION = 2 * MIB
"""Smallest run-to-run noise assumed for a reading: nvidia-smi shows whole MiB, two readings."""


@dataclass
class DeviceTerms:
    """What turns allocated bytes into a reading on the user's card: ``context`` and its
    uncertainty (bytes; 0 on the CPU), the measured ``noise`` (bytes), the model-mismatch
    fraction, whether readings are ``nvidia-smi`` figures (CUDA) or allocated peaks (CPU), and
    the vocabulary (for the logits a fallback may copy)."""

    context: float
    context_spread: float
    noise: float
    mismatch: float
    cuda: bool
    vocab: int = 0
    extra_per_token: float = 0.0
    slack: dict[tuple[str, str, bool], tuple[float, float]] = field(default_factory=dict)

    def extras(self, seq: int) -> list[float]:
        """Extra activations per sample (bytes) to try at sequence length ``seq``: 0 to the
        stand-in allowance, evenly spaced (``[0.0]`` for the user's own model)."""
        top = self.extra_per_token * seq
        if top <= 0:
            return [0.0]
        return [top * i / (EXTRA_ACTIVATION_POINTS - 1) for i in range(EXTRA_ACTIVATION_POINTS)]


def device_terms(obs: Observation, calibrations: list[Calibration], *, cuda: bool, noise: float,
                 stand_in: bool, vocab: int = 0, layers_hidden: int = 0) -> DeviceTerms:
    """The context (stated, else the median measured here), its spread, and the allowances: the
    stand-in's extra activations per token (``layers_hidden``: layers × hidden size) and the
    allocator's slack per kind of step."""
    mismatch = STAND_IN_MISMATCH if stand_in else OWN_MODEL_MISMATCH
    extra = IMPLEMENTATION_SPREAD * layers_hidden if stand_in else 0.0
    noise = max(noise, READING_RESOLUTION if cuda else 0.0)
    if not cuda:
        return DeviceTerms(0.0, 0.0, noise, mismatch, False, vocab, extra)
    slack = slack_ranges(calibrations, vocab)
    if obs.context_mib is not None:
        return DeviceTerms(obs.context_mib * MIB, STATED_CONTEXT_SPREAD, noise, mismatch, True, vocab, extra, slack)
    measured = [c for cal in calibrations for c in cal.context if c is not None]
    context = statistics.median(measured) if measured else 0.0
    return DeviceTerms(context, UNKNOWN_CONTEXT_SPREAD, noise, mismatch, True, vocab, extra, slack)


def logits_bytes(batch: int, seq: int, vocab: int) -> float:
    """L: one bf16 copy of the logits, B·T·V·2 bytes — the unit of the naive loss's buffers."""
    return float(batch * seq * vocab * 2)


def slack_kind(cal: Calibration) -> tuple[str, str, bool]:
    """The calibrations whose slack is pooled: one back-end, attention implementation and
    checkpointing setting (the same program apart from T and an evaluation pass first, so the
    same kinds of blocks cached between phases)."""
    return cal.backend, cal.family.attention, cal.family.checkpointing


def slack_ranges(calibrations: list[Calibration], vocab: int) -> dict[tuple[str, str, bool], tuple[float, float]]:
    """Per :func:`slack_kind`: the smallest and largest measured (peak reserved − peak
    allocated) / L over its calibration steps (``{}`` without a vocabulary or reserved figures)."""
    ratios: dict[tuple[str, str, bool], list[float]] = {}
    for cal in calibrations:
        for b, figure, reserved in zip(cal.batches, cal.figures, cal.reserved):
            if vocab and figure is not None and reserved is not None:
                ratios.setdefault(slack_kind(cal), []).append(max(0.0, reserved - figure) /
                                                              logits_bytes(b, cal.family.seq, vocab))
    return {kind: (min(r), max(r)) for kind, r in ratios.items()}


def slack_ratio(cal: Calibration) -> float | None:
    """Reserved − allocated peak, as a fraction of what the step allocates above its static
    bytes, at the calibration's largest measured batch (CUDA; ``None`` on the CPU).

    Why a ratio and not a line in B: between two small steps the slack jumps by hundreds of MiB
    (which cached block a request lands in), so its line extrapolates to nonsense; as a share of
    the transient bytes it scales with the step. It stays a rough figure, hence the allocator
    tolerance of half the predicted slack.
    """
    for figure, reserved, static in reversed(list(zip(cal.figures, cal.reserved, cal.static))):
        if figure is not None and reserved is not None and static is not None and figure > static:
            return max(0.0, (reserved - figure) / (figure - static))
    return None


def _static(cal: Calibration) -> float:
    values = [s for s in cal.static if s is not None]
    return statistics.median(values) if values else 0.0


@dataclass
class Reading:
    """A predicted reading (bytes), the allocated peak and phase behind it, its allocator
    uncertainty (bytes), whether the card caps it and whether it fits, the step's transient
    bytes (allocated peak − static) and its tokens (B·T)."""

    value: float
    allocated: float
    phase: str
    allocator: float
    capped: bool
    fits: bool
    transient: float = 0.0
    tokens: int = 0
    slack_spread: float = 0.0
    extra: float = 0.0


def predict_reading(cal: Calibration, batch: int, terms: DeviceTerms, card_bytes: float,
                    extra: float = 0.0) -> Reading | None:
    """The reading ``cal`` predicts at ``batch`` on the user's card, with ``extra`` bytes of
    activations per sample beyond the model's (see the module's account)."""
    predicted = cal.predict(batch, extra)
    if predicted is None:
        return None
    allocated, phase = predicted
    transient = max(0.0, allocated - _static(cal))
    tokens = batch * cal.family.seq
    if not terms.cuda:
        return Reading(allocated, allocated, phase, 0.0, False, allocated <= card_bytes, transient, tokens,
                       extra=extra)
    if slack_kind(cal) in terms.slack and terms.vocab:
        lo, hi = terms.slack[slack_kind(cal)]
        unit = logits_bytes(batch, cal.family.seq, terms.vocab)
        slack, spread = 0.5 * (lo + hi) * unit, 0.5 * (hi - lo) * unit
    else:
        ratio = slack_ratio(cal)
        slack = ratio * transient if ratio is not None else 0.0
        spread = 0.5 * slack
    allocator = ALLOCATOR_ALLOWANCE * allocated + spread
    floor = terms.context + allocated
    value = floor + slack
    if floor > card_bytes:
        return Reading(value, allocated, phase, allocator, False, False, transient, tokens, spread, extra)
    if value > card_bytes:
        # The allocator frees its cache and retries: the reading stays within [floor, card].
        return Reading(card_bytes, allocated, phase, card_bytes - floor, True, True, transient, tokens, spread, extra)
    if value + spread > card_bytes:
        # the upper part of the slack range is cut by the card: the reading lies within [value - spread, card]
        low = value - spread
        return Reading(0.5 * (low + card_bytes), allocated, phase, ALLOCATOR_ALLOWANCE * allocated +
                       0.5 * (card_bytes - low), False, True, transient, tokens, spread, extra)
    return Reading(value, allocated, phase, allocator, False, True, transient, tokens, spread, extra)


def naive_tolerance(reading: Reading, terms: DeviceTerms) -> Tolerance:
    """What the naive reading may differ by: noise, model mismatch, context, allocator."""
    return Tolerance(terms.noise, terms.mismatch * reading.allocated, terms.context_spread, reading.allocator)


def saving_tolerance(naive: Reading, fused: Reading, terms: DeviceTerms) -> Tolerance:
    """What the saving (naive − fused) may differ by: both readings' noise, the mismatch of
    the saving itself, and the allocator terms of both steps (the context cancels).

    The two steps are different programs, so their slack ranges add. With the fused path NOT
    active (``fused is naive``) both runs are nearly the same program: only the wrapper's
    fallback line moves the reading — by up to one bf16 copy of the logits (B·T·V·2 bytes): a
    fallback that upcasts the logits to fp32 read exactly that much above the naive step on the
    H200 (B=16, T=1024, V=32777: +1,024 MiB), or the model mismatch of the step's transient bytes
    if larger — and the allocator's rounding of the step's blocks."""
    if fused is naive:
        fallback = max(terms.mismatch * naive.transient, naive.tokens * terms.vocab * 2)
        return Tolerance(2 * terms.noise, fallback, 0.0, ALLOCATOR_ALLOWANCE * naive.allocated if terms.cuda else 0.0)
    saving = abs(naive.value - fused.value)
    if naive.capped or fused.capped:
        allocator = naive.allocator + fused.slack_spread
    elif naive.slack_spread or fused.slack_spread:
        allocator = naive.slack_spread + fused.slack_spread
    else:
        allocator = abs(naive.allocator - fused.allocator)
    return Tolerance(2 * terms.noise, terms.mismatch * saving, 0.0, max(allocator, ALLOCATOR_ALLOWANCE * saving))


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"
