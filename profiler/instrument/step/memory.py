"""The memory of one measured training step: its named parts, the peak written as their sum,
and the count of what autograd saves.

- :class:`StepMemory`: bytes of a step (parameters, gradients, optimizer state, batch, static,
  activations, saved tensors, loss region, peak) and :class:`Part`, one named slice of the peak;
- :func:`compose_peak`: named parts that sum exactly to the peak;
- :class:`SavedTensorCounter`: ``saved_tensors_hooks`` that count the distinct tensors saved for
  backward (and which of them are autocast's copies of weights).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fusedce_profiler.instrument.protocol import Phase


@dataclass
class Part:
    """One named slice of the peak, in bytes."""

    name: str
    bytes: int


@dataclass
class StepMemory:
    """Memory of one training step (bytes; absolute unless named ``*_extra``).

    - ``parameters``, ``gradients``, ``optimizer_state``: sizes of those tensors (fp32).
    - ``batch``: the input ids and targets.
    - ``static``: allocated when the step starts (parameters + optimizer state + batch +
      anything else left alive, e.g. cuBLAS workspaces on CUDA).
    - ``activations``: what the trunk's forward left allocated when the loss begins
      (tensors saved for backward, the hidden states).
    - ``saved_tensors``: bytes of the distinct tensors the trunk saved for backward, counted by
      ``saved_tensors_hooks`` (parameters excluded); ``weight_copies``: the part of those that
      are autocast's bf16 copies of fp32 weights.
    - ``loss_extra``: the loss phase's peak above its start (logits, their fp32 copies and
      gradients, the lm_head weight gradient). The loss region is not hooked: hooks could change
      how a compiled back-end runs.
    - ``peak``: the step's peak allocated; ``peak_phase``: the phase where it happened;
      ``composition``: named parts summing exactly to ``peak``.
    - ``peak_reserved``: the caching allocator's peak reserved (CUDA); ``device_used``: bytes
      in use on the device after the step (``mem_get_info``: what ``nvidia-smi`` shows for a
      lone process); ``context``: ``device_used`` minus reserved (CUDA context, cuBLAS/kernels).
      ``smi_peak`` = ``context + peak_reserved``: ``nvidia-smi`` at the step's high-water mark.
    """

    source: str
    parameters: int
    gradients: int
    optimizer_state: int
    batch: int
    static: int
    activations: int
    saved_tensors: int
    weight_copies: int
    loss_extra: int
    peak: int
    peak_phase: str
    composition: list[Part]
    phases: list[Phase]
    peak_reserved: int | None = None
    device_used: int | None = None
    context: int | None = None
    smi_peak: int | None = None
    reserved_before_training: int | None = None

    @property
    def loss_share(self) -> float:
        """The loss region's own extra as a fraction of the step's peak."""
        return self.loss_extra / self.peak if self.peak else 0.0


class SavedTensorCounter:
    """``saved_tensors_hooks`` that count the distinct tensors autograd saves (bytes).

    Parameters are not counted (they are alive anyway). A saved tensor that is a cast of a
    parameter (autocast's bf16 weight copy: ``ToCopyBackward0`` fed by the parameter) is
    counted in ``weight_copy_bytes`` as well as in ``bytes``.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self._seen: dict[int, int] = {}
        self.weight_copy_bytes = 0
        self.active = True  # off from the head's input on: only the trunk's saved tensors count

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if not self.active or ptr in self._param_ptrs or ptr in self._seen or storage.nbytes() == 0:
            return t
        self._seen[ptr] = storage.nbytes()
        if self._is_parameter_cast(t):
            self.weight_copy_bytes += storage.nbytes()
        return t

    def _is_parameter_cast(self, t: torch.Tensor) -> bool:
        """True for a (view of a) dtype cast of a parameter: ``ToCopyBackward0`` ← parameter."""
        base = t._base if t._base is not None else t
        fn = base.grad_fn
        if fn is None or type(fn).__name__ != "ToCopyBackward0" or not fn.next_functions:
            return False
        source = fn.next_functions[0][0]
        variable = getattr(source, "variable", None)  # AccumulateGrad holds the leaf
        return variable is not None and variable.untyped_storage().data_ptr() in self._param_ptrs

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)


def compose_peak(static_parts: list[Part], static: int, phases: dict[str, Phase], peak_phase: str,
                 gradients_end: int) -> list[Part]:
    """Named parts that sum exactly to ``phases[peak_phase].peak_bytes``.

    ``static_parts`` split ``static`` (their remainder becomes "other (workspaces, batch…)").
    After the static bytes: forward → activations so far; loss → activations + loss extra;
    backward → activations + backward working set (gradients so far + activation gradients −
    freed activations); optimizer → gradients + optimizer temporaries.
    """
    parts = list(static_parts)
    parts.append(Part("other at step start", static - sum(p.bytes for p in static_parts)))
    peak = phases[peak_phase].peak_bytes
    at_loss = phases["loss"].start_bytes
    if peak_phase == "forward":
        parts.append(Part("activations (forward)", peak - static))
    elif peak_phase == "loss":
        parts += [Part("activations", at_loss - static), Part("loss region", peak - at_loss)]
    elif peak_phase == "backward":
        parts += [Part("activations", at_loss - static), Part("backward working set", peak - at_loss)]
    else:
        parts += [Part("gradients", gradients_end - static), Part("optimizer temporaries", peak - gradients_end)]
    return parts
