"""The records of a grid run: one cell's specification and its result.

The profiler appends one :class:`CellResult` per finished cell to ``results.jsonl``
(:mod:`fusedce_profiler.instrument.store`); every report, table and plot is a pure function of that file.
Byte counts are integers (bytes), times are milliseconds, relative errors are
``‖g − g_ref‖ / ‖g_ref‖`` against the fp32 reference. Rows are validated when read
(:meth:`CellResult.from_dict`): a field of the wrong type is an error naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path, PurePosixPath
from dataclasses import dataclass, field
from typing import Any

from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.precision import MODES
from fusedce_profiler.instrument.schema import build
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.fields import MAX_DIMENSION, device_field, float_field, int_field, time_field

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")


def is_backend_name(name: str) -> bool:
    """Whether ``name`` can name a back-end: a name (a letter, then letters, digits, ``_``, ``.``,
    ``-``: the built-in names and the benchmarks' variants) or ``package.module:callable``, each part
    a Python identifier (``café:loss`` too, as Python imports it). Nothing else is read back from a
    folder, so no stored name starts a spreadsheet formula (no identifier starts with ``=+-@``)."""
    if _NAME.fullmatch(name):
        return True
    module, colon, attribute = name.partition(":")
    return bool(colon) and all(part.isidentifier() for text in (module, attribute) for part in text.split("."))


def _stored_path(value: Any, name: str, under: str | None = None) -> str | None:
    """A stored path (``None`` when absent). Only its place inside the run folder is ever opened
    (:func:`fusedce_reports.timeline.timeline_file`): a path leading elsewhere is looked up by name.
    With ``under`` (a folder of the run, ``logs``), the path must be a file of that folder, as the
    writer stores it: it is shown in the report, so a path elsewhere is an invalid row."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a path, got {value!r}")
    if under is not None:
        parts = PurePosixPath(value).parts
        if len(parts) != 2 or parts[0] != under or parts[1] in ("..", ".") or "\\" in value:
            raise ValueError(f"{name} must be a file of the run's {under}/ folder, got {value[:200]!r}")
    return value


STATUSES = ("ok", "oom", "error", "timeout", "skipped")
FAILED_STATUSES = ("error", "timeout")
"""The statuses of a cell or step that failed (``oom`` and ``skipped`` are results about it)."""
REDUCTIONS = ("mean", "sum", "none")


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

    def group_key(self) -> str:
        """The spec without its back-end: cells with equal group keys measured one problem."""
        return dataclasses.replace(self, backend="").key()

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    def options(self) -> dict[str, Any]:
        """The loss options of this cell, as keyword arguments of ``linear_cross_entropy``."""
        return {
            "ignore_index": IGNORE_INDEX,
            "reduction": self.reduction,
            "label_smoothing": self.label_smoothing,
            "z_loss": self.z_loss,
            "softcap": self.softcap,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "CellSpec":
        """Validate a stored spec; ``ValueError`` naming the first bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"spec must be an object, got {type(raw).__name__}")
        unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"spec has unknown field(s) {', '.join(repr(name) for name in sorted(unknown))}")
        if not isinstance(raw.get("backend"), str) or not is_backend_name(raw["backend"]):
            raise ValueError(f"spec.backend must be a back-end name or 'module:callable', got {raw.get('backend')!r}")
        values = dict(raw)
        for name in ("tokens", "vocab", "hidden"):
            values[name] = int_field(raw.get(name), f"spec.{name}", optional=False, minimum=1, maximum=MAX_DIMENSION)
        for name in ("batch", "seq"):
            values[name] = int_field(raw.get(name), f"spec.{name}", minimum=1, maximum=MAX_DIMENSION)
        values["seed"] = int_field(raw.get("seed", 0), "spec.seed", optional=False)
        for name in ("ignore_frac", "label_smoothing", "z_loss"):
            values[name] = float_field(raw.get(name, 0.0), f"spec.{name}", optional=False)
        values["softcap"] = float_field(raw.get("softcap"), "spec.softcap")
        for name in ("ignore_frac", "label_smoothing"):
            if not 0.0 <= values[name] < 1.0:
                raise ValueError(f"spec.{name} must be in [0, 1), got {values[name]!r}")
        if not values["z_loss"] >= 0.0:
            raise ValueError(f"spec.z_loss must be at least 0, got {values['z_loss']!r}")
        if values["softcap"] is not None and not values["softcap"] > 0.0:
            raise ValueError(f"spec.softcap must be positive, got {values['softcap']!r}")
        for name, allowed in (("mode", MODES), ("reduction", REDUCTIONS)):
            if name in raw and raw[name] not in allowed:
                raise ValueError(f"spec.{name} must be one of {', '.join(allowed)}, got {raw[name]!r}")
        if "device" in raw:
            device_field(raw["device"], "spec.device")
        if "bias" in raw and not isinstance(raw["bias"], bool):
            raise ValueError(f"spec.bias must be true or false, got {raw['bias']!r}")
        return cls(**values)


@dataclass
class Parity:
    """Relative errors against the fp32 reference (``None`` where not applicable; NaN when
    the back-end's value was not finite)."""

    loss: float | None = None
    grad_hidden: float | None = None
    grad_weight: float | None = None
    grad_bias: float | None = None

    @classmethod
    def from_dict(cls, raw: dict | None) -> "Parity":
        parity = build(cls, raw or {}, "parity")
        for f in dataclasses.fields(cls):
            if (value := getattr(parity, f.name)) is not None and value < 0:  # a NaN stays: a non-finite value
                raise ValueError(f"parity.{f.name} must be at least 0 (a relative error), got {value!r}")
        return parity


@dataclass
class CellResult:
    """What one cell measured.

    Memory (bytes; ``memory_source`` says whose accounting, :mod:`fusedce_profiler.instrument.protocol`):
      - ``baseline_bytes``: allocated with the inputs alive, before the measured step.
      - ``peak_forward_bytes`` / ``peak_backward_bytes`` / ``peak_step_bytes``: peak allocated
        minus the baseline, during forward, during backward, and over the whole step
        (gradients count: they are outputs).
      - ``peak_reserved_bytes``: the caching allocator's peak reserved (CUDA only).
      - ``floor_bytes``: bytes of the gradients that must exist at the end.
      - ``predicted_bytes``: the analytic model's prediction of ``peak_step_bytes``.
      - ``oom_requested_bytes``: for ``status == "oom"``, the allocation that failed.
    Time: ``time_ms`` (median forward+backward), ``time_ms_min`` / ``time_ms_max`` and the
    raw ``times_ms``. ``snapshot_path`` / ``timeline_path``: the raw allocator snapshot and
    its timeline JSON, relative to the run folder (``--snapshot``). ``log_path``: the
    worker log holding this cell's traceback, for ``error`` and ``timeout``.
    """

    spec: CellSpec
    status: str = "ok"
    message: str = ""
    memory_source: str = "cuda-allocator"
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
    timeline_path: str | None = None
    log_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def answering(cls, spec: CellSpec, raw: object) -> "CellResult":
        """The cell job's reply to ``spec`` (:meth:`from_dict`); ``ValueError`` for a reply about another cell."""
        result = cls.from_dict(raw)
        if result.spec.key() != spec.key():
            raise ValueError(f"it is about another cell ({result.spec.backend}, N={result.spec.tokens})")
        return result

    @classmethod
    def from_dict(cls, raw: dict) -> "CellResult":
        """Validate a stored row; ``ValueError`` naming the first bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"a cell's result must be an object, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values["spec"] = CellSpec.from_dict(raw.get("spec"))
        values["parity"] = Parity.from_dict(raw.get("parity"))
        status = raw.get("status", "ok")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        for name in ("baseline_bytes", "peak_forward_bytes", "peak_backward_bytes", "peak_step_bytes",
                     "peak_reserved_bytes", "floor_bytes", "predicted_bytes", "oom_requested_bytes"):
            values[name] = int_field(raw.get(name), name, minimum=0)
        for name in ("time_ms", "time_ms_min", "time_ms_max"):
            values[name] = time_field(raw.get(name), name)
        times = raw.get("times_ms") or []
        if not isinstance(times, list):
            raise ValueError(f"times_ms must be a list, got {times!r}")
        values["times_ms"] = [time_field(t, "times_ms", optional=False) for t in times]
        for name in ("snapshot_path", "timeline_path"):
            values[name] = _stored_path(raw.get(name), name)
        values["log_path"] = _stored_path(raw.get("log_path"), "log_path", under=store.LOGS_DIR)
        for name in ("message", "backend_version", "memory_source"):
            if name in raw and not isinstance(raw[name], str):
                raise ValueError(f"{name} must be a string, got {raw[name]!r}")
        if not isinstance(raw.get("extra", {}), dict):
            raise ValueError(f"extra must be an object, got {raw.get('extra')!r}")
        if status == "ok":  # the writer stores a finished cell's measurements with it
            missing = [name for name in ("peak_step_bytes", "time_ms") if values[name] is None]
            if missing:
                raise ValueError(f"status 'ok' without its measurements ({', '.join(missing)} empty)")
        return cls(**values)


def load_results(folder: str | Path) -> store.Loaded[CellResult]:
    """The rows of a run folder's ``results.jsonl`` (the one reader; see :mod:`fusedce_profiler.instrument.store`)."""
    path = Path(folder)
    if path.is_dir():
        path = path / store.RESULTS_FILE
    return store.read_jsonl(path, CellResult.from_dict)
