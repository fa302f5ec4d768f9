"""The evaluation passes a recorder notes between its recorded steps (a Lightning sanity check or validation,
a Hugging Face evaluation): the memory the CUDA device had reserved before and after each, so the report can
say where a pass, not a training step, set the process's peak; and the model's device, which both read.

Public API: :class:`EvalPasses` (a part of :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`).
"""
from __future__ import annotations

import torch

from fusedce_profiler.instrument.recording.records import EvalPass


class EvalPasses:
    """A recorder's evaluation passes: ``passes`` (:class:`EvalPass`, in order) and the one open now, and the
    model's :attr:`device`, which they read. The recorder provides ``model``, ``enabled``, ``closed``, ``passes``
    and ``_open_pass``."""

    @property
    def device(self) -> torch.device | None:
        """The device of the model's first parameter (the CPU without one); None when the model cannot
        list them (its ``parameters()`` raised): then no step is recorded, and the training goes on."""
        try:
            param = next(self.model.parameters(), None)
        except Exception:  # noqa: BLE001 - the user's model: profiling never stops its training
            return None
        return param.device if param is not None else torch.device("cpu")

    def reserved_now(self) -> tuple[int | None, int | None]:
        """(reserved, highest reserved) bytes of the model's CUDA device now; (None, None) off CUDA."""
        device = self.device
        if device is None or device.type != "cuda":
            return None, None
        return torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device)

    def begin_pass(self, kind: str, before_step: int) -> None:
        """An evaluation pass (``"sanity check"``, ``"validation"``, ``"evaluation"``) begins."""
        if not self.enabled or self.closed or self._open_pass is not None:
            return
        reserved, high = self.reserved_now()
        self._open_pass = EvalPass(kind, int(before_step), reserved, None, high, None)

    def end_pass(self) -> None:
        if self._open_pass is not None:
            self._open_pass.reserved_after, self._open_pass.max_reserved_after = self.reserved_now()
            self.passes.append(self._open_pass)
            self._open_pass = None

    def add_pass(self, kind: str, before_step: int, reserved_before: int | None, max_reserved_before: int | None):
        """A pass whose start was seen elsewhere (Hugging Face has no "evaluation begins" event)."""
        if not self.enabled or self.closed:
            return
        reserved, high = self.reserved_now()
        self.passes.append(EvalPass(kind, int(before_step), reserved_before, reserved, max_reserved_before, high))
