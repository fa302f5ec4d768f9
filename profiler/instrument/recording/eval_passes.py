"""The evaluation passes a recorder notes between its recorded steps (a Lightning sanity check or validation,
a Hugging Face evaluation): the memory the CUDA device had reserved before and after each, so the report can
say where a pass, not a training step, set the process's peak.

Public API: :class:`EvalPasses` (a part of :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`).
"""
from __future__ import annotations

import torch

from fusedce_profiler.instrument.recording.records import EvalPass


class EvalPasses:
    """A recorder's evaluation passes: ``passes`` (:class:`EvalPass`, in order) and the one open now. The
    recorder provides ``enabled``, ``closed``, ``passes``, ``_open_pass`` and ``device`` (None: the model
    cannot list its parameters)."""

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
