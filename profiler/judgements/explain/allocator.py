"""From a step's allocated peak to what ``nvidia-smi`` shows on the user's card, with the
tolerance of each term.

``nvidia-smi`` (one process) = CUDA context + the caching allocator's reserved bytes. At the
step's peak the allocator holds the allocated peak plus *slack*: blocks cached between phases
and rounded-up segments, which an evaluation pass run first enlarges (its B·T·V logits stay
cached). The slack is measured at every calibration step (peak reserved − peak allocated) and
scaled with the step's transient bytes (:func:`slack_ratio`).

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
from dataclasses import dataclass

from fusedce_profiler.judgements.explain.records import GIB, MIB, Calibration, Observation, Tolerance

UNKNOWN_CONTEXT_SPREAD = 250 * MIB
"""Uncertainty of the user's CUDA context when they do not state it (bytes): contexts of
different GPU classes and drivers differ by a few hundred MiB."""
STATED_CONTEXT_SPREAD = 16 * MIB
"""Uncertainty of a context the user measured and stated (nvidia-smi rounds to MiB)."""
STAND_IN_MISMATCH = 0.04
"""Model-mismatch allowance (fraction of the predicted step) when the model is a stand-in
preset for the user's own implementation (same shapes, different code)."""
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


def device_terms(obs: Observation, calibrations: list[Calibration], *, cuda: bool, noise: float,
                 stand_in: bool, vocab: int = 0) -> DeviceTerms:
    """The context (stated, else the median measured here), its spread, and the allowances."""
    mismatch = STAND_IN_MISMATCH if stand_in else OWN_MODEL_MISMATCH
    noise = max(noise, READING_RESOLUTION if cuda else 0.0)
    if not cuda:
        return DeviceTerms(0.0, 0.0, noise, mismatch, False, vocab)
    if obs.context_mib is not None:
        return DeviceTerms(obs.context_mib * MIB, STATED_CONTEXT_SPREAD, noise, mismatch, True, vocab)
    measured = [c for cal in calibrations for c in cal.context if c is not None]
    context = statistics.median(measured) if measured else 0.0
    return DeviceTerms(context, UNKNOWN_CONTEXT_SPREAD, noise, mismatch, True, vocab)


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


def predict_reading(cal: Calibration, batch: int, terms: DeviceTerms, card_bytes: float) -> Reading | None:
    """The reading ``cal`` predicts at ``batch`` on the user's card (see the module's account)."""
    predicted = cal.predict(batch)
    if predicted is None:
        return None
    allocated, phase = predicted
    transient = max(0.0, allocated - _static(cal))
    tokens = batch * cal.family.seq
    if not terms.cuda:
        return Reading(allocated, allocated, phase, 0.0, False, allocated <= card_bytes, transient, tokens)
    ratio = slack_ratio(cal)
    slack = ratio * transient if ratio is not None else 0.0
    allocator = ALLOCATOR_ALLOWANCE * allocated + 0.5 * slack
    floor = terms.context + allocated
    value = floor + slack
    if floor > card_bytes:
        return Reading(value, allocated, phase, allocator, False, False, transient, tokens)
    if value > card_bytes:
        # The allocator frees its cache and retries: the reading stays within [floor, card].
        return Reading(card_bytes, allocated, phase, card_bytes - floor, True, True, transient, tokens)
    return Reading(value, allocated, phase, allocator, False, True, transient, tokens)


def naive_tolerance(reading: Reading, terms: DeviceTerms) -> Tolerance:
    """What the naive reading may differ by: noise, model mismatch, context, allocator."""
    return Tolerance(terms.noise, terms.mismatch * reading.allocated, terms.context_spread, reading.allocator)


def saving_tolerance(naive: Reading, fused: Reading, terms: DeviceTerms) -> Tolerance:
    """What the saving (naive − fused) may differ by: both readings' noise, the mismatch of
    the saving itself, and the allocator terms of both steps (the context cancels).

    With the fused path NOT active (``fused is naive``) both runs are nearly the same program:
    the allocator repeats itself and only the wrapper's fallback line moves the reading — by up
    to one bf16 copy of the logits (B·T·V·2 bytes): a fallback that upcasts the logits to fp32
    read exactly that much above the naive step on the H200 (B=16, T=1024, V=32777: +1,024 MiB),
    or the model mismatch of the step's transient bytes if larger."""
    if fused is naive:
        fallback = max(terms.mismatch * naive.transient, naive.tokens * terms.vocab * 2)
        return Tolerance(2 * terms.noise, fallback, 0.0, 0.0)
    saving = abs(naive.value - fused.value)
    allocator = naive.allocator if naive.capped or fused.capped else abs(naive.allocator - fused.allocator)
    return Tolerance(2 * terms.noise, terms.mismatch * saving, 0.0, max(allocator, ALLOCATOR_ALLOWANCE * saving))


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"
