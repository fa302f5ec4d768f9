"""The records of a traced step's peak: the kinds and groups it is split into, the dataclasses
that hold it, and the logits verdict drawn from them.

Kinds of memory alive at the peak (:data:`KINDS`): what was alive before the step
(:data:`STATIC_KINDS`: parameters, optimizer state, the batch), the parameters' gradients, and
activations (:data:`ACTIVATION_KINDS`), classified by the innermost module's class —
``Embedding``; ``*Attention*``/``*Attn*`` (within it, tensors of B·heads·T·T elements are the
attention scores/probabilities); ``*MLP*`` / ``*FeedForward*``; ``*Norm*``; the located LM head;
allocations inside the loss region (the step's ``loss`` record-function, or a frame of a
``*cross_entropy*``/``*loss*`` function in the model) are loss internals; unmapped backward
allocations are backward temporaries; what the optimizer's ``step()`` allocates is optimizer
temporaries (:data:`OPTIMIZER_KINDS`, not an activation). :data:`GROUPS` gathers kinds by what a back-end may
replace.

Everything is plain dataclasses (JSON via ``dataclasses.asdict``, back via
:meth:`Attribution.from_dict`); the measuring is :mod:`fusedce_profiler.instrument.tracing.trace`, nothing here renders.
Public API: :data:`KINDS`, :data:`STATIC_KINDS`, :data:`ACTIVATION_KINDS`, :data:`GROUPS`,
:class:`Attribution`, :class:`KindBytes`, :class:`ModuleBytes`, :class:`LargeTensor`,
:func:`logits_verdict`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusedce_profiler.instrument.schema import build

STATIC_KINDS = ("parameters", "optimizer state", "batch and other static")
ACTIVATION_KINDS = ("embedding", "attention scores/probabilities", "attention (other)", "MLP", "norms",
                    "LM-head input/logits", "loss internals", "backward temporaries", "other activations")
#: Bytes the optimizer's ``step()`` allocates for itself (AdamW's per-parameter temporaries).
OPTIMIZER_KINDS = ("optimizer temporaries",)
KINDS = STATIC_KINDS + ("gradients",) + OPTIMIZER_KINDS + ACTIVATION_KINDS

#: Kinds grouped by what a back-end may replace: the loss's saving is the change in "LM-head/loss".
GROUPS = {
    "LM-head/loss": ("LM-head input/logits", "loss internals"),
    "attention": ("attention scores/probabilities", "attention (other)"),
    "MLP": ("MLP",),
    "norms": ("norms",),
    "embedding": ("embedding",),
    "parameters, gradients, optimizer": ("parameters", "gradients", "optimizer state", "optimizer temporaries"),
    "other": ("batch and other static", "backward temporaries", "other activations"),
}


@dataclass
class KindBytes:
    """Bytes of one kind alive at the peak; ``backward_bytes`` of them were allocated in backward."""

    kind: str
    bytes: int
    backward_bytes: int = 0
    blocks: int = 0


@dataclass
class ModuleBytes:
    """Bytes alive at the peak that one module (by name) allocated, with its kind."""

    module: str
    kind: str
    bytes: int


FUSEDCE_FORWARD_OPS = ("fusedce::forward", "GeneratedBackwardFor_fusedce_forward_default")
"""The names the profiler gives fusedce's recompute forward (``fusedce/custom_op.py``): the op, and the
autograd wrapper PyTorch generates for a custom op with an autograd formula (the innermost named op
around an allocation in a training step)."""
FUSEDCE_KEPT_SOURCE = "fusedce/custom_op.py"
"""Where that op allocates the logits it keeps (the innermost source line outside torch)."""
FUSEDCE_KEPT = "fusedce's kept logits"
"""``LargeTensor.dtype_from`` of that allocation: the logits of part of the vocabulary that an explicit
budget keeps for the backward (``fusedce/kept_plan.py``)."""


@dataclass
class LargeTensor:
    """One allocation of at least N·V bytes (the logits detector)."""

    bytes: int
    dtype: str
    shape: list[int] | None
    module: str
    kind: str
    op: str
    source: str
    phase: str
    kept_for_backward: bool
    alive_at_peak: bool
    dtype_from: str = "shape"


@dataclass
class Attribution:
    """A traced step's peak split by kind and module (bytes, absolute).

    ``peak_bytes`` = Σ ``kinds`` (exactly, by construction); ``metered_peak_bytes`` is the
    :class:`~fusedce_profiler.instrument.protocol.MemoryMeter`'s authoritative peak of the measured step (set by
    the caller) and ``relative_gap`` their difference relative to it. ``peak_phase`` is the
    phase holding the traced peak. ``large_tensors``: the logits detector's findings, with
    ``threshold_bytes`` = N·V; ``tokens``, ``vocab``, ``batch``, ``seq``, ``heads`` the shapes used.
    """

    peak_bytes: int
    peak_phase: str
    kinds: list[KindBytes]
    modules: list[ModuleBytes]
    large_tensors: list[LargeTensor]
    threshold_bytes: int
    tokens: int
    vocab: int
    batch: int
    seq: int
    heads: list[int]
    layers: int = 0
    metered_peak_bytes: int | None = None
    events: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def relative_gap(self) -> float | None:
        if not self.metered_peak_bytes:
            return None
        return (self.peak_bytes - self.metered_peak_bytes) / self.metered_peak_bytes

    def kind_bytes(self, kind: str) -> int:
        return next((k.bytes for k in self.kinds if k.kind == kind), 0)

    def group_bytes(self, group: str) -> int:
        return sum(self.kind_bytes(k) for k in GROUPS[group])

    @classmethod
    def from_dict(cls, raw: dict, where: str = "attribution") -> "Attribution":
        """A stored attribution, every field checked (``ValueError`` naming it: :func:`~fusedce_profiler.instrument.schema.build`)."""
        return build(cls, raw, where)


def logits_verdict(attribution: Attribution, *, naive: bool, fused: bool = True) -> tuple[str, str]:
    """(status, sentence) from the detector: ``materialised``, ``transient`` or ``none``.

    ``kept``: every tensor kept from the forward into the backward is logits that fusedce's forward
    kept for part of the vocabulary under an explicit budget (``fusedce/kept_plan.py``).
    ``materialised``: a logits-sized tensor was kept from the forward into the backward (with
    ``naive`` that is the expected naive loss; otherwise the fused path is not active in this
    step). ``transient``: logits-sized blocks existed but none was kept for backward (a fused
    loss whose one chunk covers all N rows at a small size does this). ``none``: no tensor of
    N·V bytes or more existed at all — the fused path is active.

    ``fused=False`` words the verdict for a back-end that computes the plain loss without
    fusing it (torch.compile): its logits are expected, not a fused path that failed.
    """
    from_units = _fmt
    kept = [t for t in attribution.large_tensors if t.kept_for_backward]
    where = lambda t: (f"{from_units(t.bytes)} {t.dtype}" + (f" {tuple(t.shape)}" if t.shape else "")
                       + f" by {t.op or 'an op'} in {t.module} at {t.source}")
    n, v = attribution.tokens, attribution.vocab
    others = [t for t in kept if t.dtype_from != FUSEDCE_KEPT]
    if kept and not others:
        t = kept[0]
        return "kept", (f"fusedce kept the logits of part of the vocabulary from the forward for the backward, "
                        f"{from_units(t.bytes)} at {t.source}, as an explicit memory_budget plans (\"fast\", bytes "
                        f"or a multiple of the floor; fusedce/kept_plan.py): the fused path is active, the rest of "
                        f"the vocabulary is recomputed, and those bytes stay until the backward")
    kept = others
    if kept:
        t = kept[0]
        more = f" (+{len(kept) - 1} more)" if len(kept) > 1 else ""
        if naive:
            return "materialised", (f"the N×V logits are materialised, as expected for the naive loss: {where(t)}"
                                    f"{more}, kept from the forward into the backward")
        if not fused:
            return "materialised", (f"the logits are materialised, as this back-end computes the plain loss (it is "
                                    f"not a fused loss): {where(t)}{more}, kept from the forward into the backward")
        return "materialised", (f"the fused path is not active in this step: a logits-sized tensor ({where(t)}"
                                f"{more}) was kept from the forward into the backward, as eager logits are")
    if attribution.large_tensors:
        t = attribution.large_tensors[0]
        return "transient", (f"no logits-sized tensor was kept for backward; {len(attribution.large_tensors)} "
                             f"transient block(s) of ≥ N·V = {n}×{v} bytes existed, the largest {where(t)} — "
                             + ("what a fused loss does when one chunk covers all N rows, not materialised logits"
                                if fused else "freed before the backward"))
    return "none", (f"no tensor of N·V = {from_units(attribution.threshold_bytes)} or more was allocated in the "
                    "step: " + ("the fused path is active (no logits materialised)" if fused else "no logits materialised"))


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"
