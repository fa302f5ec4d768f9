"""Analytic memory model: the predicted peak extra bytes of one forward+backward step.

"Peak extra" is measured over the baseline with the inputs alive, gradients included
(:mod:`fusedce_profiler.grid.cell`). Each model replays, as a :class:`Tape`, the buffers that the
back-end's ops allocate and free, in order; the prediction is the tape's maximum.

The eager ``torch`` back-end, ``F.cross_entropy(F.linear(h, W, b), y)``, runs these
ATen ops (N tokens, V vocabulary, H hidden; s_c bytes per element of the compute
dtype; "amp" = fp32 weight under autocast):

forward
  1. amp: autocast casts W (and b) to the compute dtype: V·H·s_c, kept for backward.
  2. ``mm``/``addmm``: logits (N, V) in the compute dtype: N·V·s_c.
  3. ``cross_entropy`` = ``log_softmax(logits, dtype=logits.dtype)`` + ``nll_loss``.
     CUDA: log_softmax keeps the explicit dtype (autocast's fp32_set_opt_dtype policy
     leaves a given dtype alone), so log-probs are N·V·s_c; under amp ``nll_loss`` is on
     autocast's fp32 list and casts them to fp32 (N·V·4), a copy that ``nll_loss`` saves
     for backward. CPU: autocast casts the logits to fp32 for log_softmax (N·V·4, freed
     when cross_entropy returns) and the log-probs are fp32 (N·V·4).
  4. the logits are freed when ``cross_entropy`` returns (nothing saved them).
backward
  5. ``nll_loss_backward``: a dense (N, V) gradient in the dtype of its input.
  6. CUDA amp: ``ToCopyBackward`` casts it back to s_c (after NllLossBackward released
     its fp32 copy); CPU amp: ``_log_softmax_backward_data`` works in fp32 and the cast
     back to s_c follows it.
  7. ``_log_softmax_backward_data``: d logits (N, V); the log-probs are released.
  8. ``mm`` backward: grad_h (N·H·s_h) and grad_W in s_c (V·H·s_c); amp: cast to the
     fp32 ``.grad`` (V·H·4) while the s_c copy is alive.

So, without bias and for N·V ≫ V·H, under CUDA amp-bf16 the peak is at step 5:
2VH + 10NV bytes; in bf16 at step 7: 6NV; on the CPU under amp-bf16 at step 7:
2VH + 12NV. For few tokens and a wide head the gradient GEMMs of step 8 set it instead
(amp: 2NH + 2VH + 4VH).

``fusedce`` is modelled by its own ``fusedce.memory_model.predict_peak_bytes``. ``cce`` follows its documented design (no logits; recomputed in
backward): the gradients plus, under amp, a compute-dtype copy of W. Other back-ends,
and label smoothing / z-loss / soft-cap (whose extra elementwise ops depend on the
caller's formula), get no prediction (``None``) and say why.

Public API: :func:`predict`, :class:`Prediction`, :func:`floor_bytes`, :func:`inputs_bytes`,
:func:`least_bytes`, :class:`Tape`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


from fusedce_profiler.instrument.precision import dtype_bytes, precision
from fusedce_profiler.instrument.records import CellSpec


@dataclass(frozen=True)
class Prediction:
    """Predicted peak extra bytes (``None`` with ``reason`` when not modelled)."""

    peak_bytes: int | None
    forward_bytes: int | None = None
    backward_bytes: int | None = None
    reason: str = ""


@dataclass
class Tape:
    """Buffers alive over time: ``alloc(name, bytes)`` / ``free(name)``; peaks per phase."""

    live: dict[str, int] = field(default_factory=dict)
    phase_peaks: dict[str, int] = field(default_factory=dict)
    phase: str = "forward"

    def alloc(self, name: str, nbytes: int) -> None:
        if name in self.live:
            raise ValueError(f"buffer {name!r} is already live")
        self.live[name] = int(nbytes)
        total = sum(self.live.values())
        self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), total)

    def free(self, *names: str) -> None:
        for name in names:
            del self.live[name]

    def start(self, phase: str) -> None:
        self.phase = phase
        self.phase_peaks[phase] = sum(self.live.values())

    @property
    def peak(self) -> int:
        return max(self.phase_peaks.values(), default=0)


def floor_bytes(spec: CellSpec) -> int:
    """Bytes of the gradients that must exist at the end: grad_h + grad_W (+ grad_b).

    The one formula is :func:`fusedce.planner.gradient_floor_bytes`; this applies it to a
    cell's shapes and mode.
    """
    from fusedce.planner import gradient_floor_bytes

    prec = precision(spec.mode)
    return gradient_floor_bytes(spec.tokens, spec.hidden, spec.vocab, prec.hidden, prec.weight, has_bias=spec.bias)


def inputs_bytes(spec: CellSpec) -> int:
    """Bytes of a cell's inputs (:func:`fusedce_profiler.grid.inputs.make_inputs`), alive before its
    step starts: hidden (N, H) in the mode's hidden dtype, weight (V, H) and bias (V,) in its weight
    dtype, targets (N,) int64."""
    prec = precision(spec.mode)
    n, h, v = spec.tokens, spec.hidden, spec.vocab
    bias = v * dtype_bytes(prec.weight) if spec.bias else 0
    return n * h * dtype_bytes(prec.hidden) + v * h * dtype_bytes(prec.weight) + bias + n * 8


def least_bytes(spec: CellSpec) -> int:
    """What every back-end must hold at once to run ``spec``: its inputs (:func:`inputs_bytes`) and,
    at the end of the step, their gradients (:func:`floor_bytes`). A cell needing more than its
    device's memory fails with every back-end."""
    return inputs_bytes(spec) + floor_bytes(spec)


def _torch_eager(spec: CellSpec) -> Prediction:
    if spec.label_smoothing or spec.z_loss or spec.softcap is not None:
        return Prediction(None, reason="no model for label smoothing, z-loss or soft-cap in eager torch")
    prec = precision(spec.mode)
    n, h, v = spec.tokens, spec.hidden, spec.vocab
    s_c, s_h, s_w = dtype_bytes(prec.compute), dtype_bytes(prec.hidden), dtype_bytes(prec.weight)
    amp = prec.autocast is not None and prec.weight != prec.compute
    cuda = spec.device.startswith("cuda")
    nv = n * v
    tape = Tape()
    if amp:
        tape.alloc("W_c", v * h * s_c)
        if spec.bias:
            tape.alloc("b_c", v * s_c)
    tape.alloc("logits", nv * s_c)
    if cuda:
        tape.alloc("logp", nv * s_c)
        if amp:
            tape.alloc("logp_fp32", nv * 4)
    elif amp:
        tape.alloc("logits_fp32", nv * 4)
        tape.alloc("logp", nv * 4)
        tape.free("logits_fp32")
    else:
        tape.alloc("logp", nv * s_c)
    tape.free("logits")

    tape.start("backward")
    if cuda and amp:
        tape.alloc("d_logp_fp32", nv * 4)
        tape.free("logp_fp32")
        tape.alloc("d_logp", nv * s_c)
        tape.free("d_logp_fp32")
        tape.alloc("d_logits", nv * s_c)
        tape.free("logp", "d_logp")
    elif amp:
        tape.alloc("d_logp", nv * 4)
        tape.alloc("d_logits_fp32", nv * 4)
        tape.free("logp", "d_logp")
        tape.alloc("d_logits", nv * s_c)
        tape.free("d_logits_fp32")
    else:
        tape.alloc("d_logp", nv * s_c)
        tape.alloc("d_logits", nv * s_c)
        tape.free("logp", "d_logp")
    tape.alloc("grad_h", n * h * s_h)
    tape.alloc("grad_W_c", v * h * s_c)
    if spec.bias:
        tape.alloc("grad_b_c", v * s_c)
    tape.free("d_logits")
    if amp:
        tape.free("W_c")
        tape.alloc("grad_W", v * h * s_w)
        tape.free("grad_W_c")
        if spec.bias:
            tape.free("b_c")
            tape.alloc("grad_b", v * s_w)
            tape.free("grad_b_c")
    return Prediction(tape.peak, tape.phase_peaks["forward"], tape.phase_peaks["backward"])


_FUSEDCE_BUDGETS = {"fusedce": None, "fusedce-min": "min", "fusedce-fast": "fast"}
"""fusedce's back-ends (:mod:`fusedce_profiler.instrument.backends`) and the ``memory_budget`` each passes."""


def _fusedce(spec: CellSpec) -> Prediction:
    try:
        from fusedce.memory_model import predict_peak_bytes
    except ImportError:
        return Prediction(None, reason="fusedce.memory_model.predict_peak_bytes is not available")
    prec = precision(spec.mode)
    # fusedce's impl="auto": Triton kernels on CUDA tensors, its PyTorch path elsewhere.
    impl = "triton" if spec.device.startswith("cuda") else "torch"
    model = predict_peak_bytes(spec.tokens, spec.hidden, spec.vocab, hidden_dtype=prec.hidden,
                               weight_dtype=prec.weight, compute_dtype=prec.compute, has_bias=spec.bias,
                               bias_dtype=prec.weight if spec.bias else None, impl=impl,
                               memory_budget=_FUSEDCE_BUDGETS[spec.backend], reduction=spec.reduction)
    return Prediction(int(model.step), int(model.forward), int(model.backward))


def _cce(spec: CellSpec) -> Prediction:
    prec = precision(spec.mode)
    copy = spec.vocab * spec.hidden * dtype_bytes(prec.compute) if prec.weight != prec.compute else 0
    return Prediction(floor_bytes(spec) + copy)


_MODELS = {"torch": _torch_eager, "cce": _cce, **{name: _fusedce for name in _FUSEDCE_BUDGETS}}


def predict(spec: CellSpec) -> Prediction:
    """The predicted peak extra bytes of ``spec``'s step for its back-end."""
    model = _MODELS.get(spec.backend)
    if model is None:
        return Prediction(None, reason=f"no analytic model for back-end {spec.backend!r}")
    return model(spec)
