"""The records that cross module borders: one grid cell's specification and its result.

The profiler appends one :class:`CellResult` per finished cell to ``results.jsonl``
(``to_json`` / ``from_json``); every report, table and plot is a pure function of that
file. Byte counts are integers (bytes), times are milliseconds, relative errors are
``‖g − g_ref‖ / ‖g_ref‖`` against the fp32 reference.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

MODES = ("amp-bf16", "amp-fp16", "bf16", "fp32")
STATUSES = ("ok", "oom", "error", "skipped")


@dataclass(frozen=True)
class CellSpec:
    """One point of the grid: which back-end, which shapes, which options.

    ``tokens`` is N = B·T, the number of rows the loss sees. ``batch``/``seq`` are kept
    when the user gave them separately (informational; the loss only sees N).
    """

    backend: str
    tokens: int
    vocab: int
    hidden: int
    mode: str = "amp-bf16"
    device: str = "cuda"
    bias: bool = False
    ignore_frac: float = 0.0
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None
    reduction: str = "mean"
    batch: int | None = None
    seq: int | None = None
    seed: int = 0

    def key(self) -> str:
        """A stable identifier: two specs with equal keys are the same measurement."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def options(self) -> dict[str, Any]:
        """The loss options of this cell, as keyword arguments of ``linear_cross_entropy``."""
        return {
            "ignore_index": -100,
            "reduction": self.reduction,
            "label_smoothing": self.label_smoothing,
            "z_loss": self.z_loss,
            "softcap": self.softcap,
        }


@dataclass
class Parity:
    """Relative errors against the fp32 reference (``None`` where not applicable)."""

    loss: float | None = None
    grad_hidden: float | None = None
    grad_weight: float | None = None
    grad_bias: float | None = None


@dataclass
class CellResult:
    """What one cell measured.

    Memory (bytes; ``memory_source`` says whose accounting):
      - ``baseline_bytes``: allocated with the inputs alive, before the measured step.
      - ``peak_forward_bytes`` / ``peak_backward_bytes`` / ``peak_step_bytes``: peak allocated
        minus the baseline, during forward, during backward, and over the whole step
        (gradients count: they are outputs).
      - ``peak_reserved_bytes``: the caching allocator's peak reserved (CUDA only).
      - ``floor_bytes``: bytes of the gradients that must exist at the end.
      - ``predicted_bytes``: the analytic model's prediction of ``peak_step_bytes``.
      - ``oom_requested_bytes``: for ``status == "oom"``, the allocation that failed.
    Time: ``time_ms`` (median forward+backward), ``time_ms_min`` / ``time_ms_max`` and the
    raw ``times_ms``.
    """

    spec: CellSpec
    status: str = "ok"
    message: str = ""
    memory_source: str = "cuda-allocator"  # or "cpu-profiler"
    baseline_bytes: int | None = None
    peak_forward_bytes: int | None = None
    peak_backward_bytes: int | None = None
    peak_step_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    floor_bytes: int | None = None
    predicted_bytes: int | None = None
    oom_requested_bytes: int | None = None
    time_ms: float | None = None
    time_ms_min: float | None = None
    time_ms_max: float | None = None
    times_ms: list[float] = field(default_factory=list)
    parity: Parity = field(default_factory=Parity)
    backend_version: str = ""
    snapshot_path: str | None = None
    timeline_png: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "CellResult":
        raw = json.loads(line)
        raw["spec"] = CellSpec(**raw["spec"])
        raw["parity"] = Parity(**raw.get("parity") or {})
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
