"""The grid: what the user asks to measure, validated and expanded into cells.

Public API: :class:`GridSpec` (``validate()``, ``cells()``), :func:`default_device`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

from fusedce_profiler.instrument import capacity
from fusedce_profiler.instrument.backends import get_backend
from fusedce_profiler.instrument.precision import LIGHTNING_ALIASES, canonical_mode
from fusedce_profiler.instrument.records import REDUCTIONS, CellSpec


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class GridSpec:
    """Lists of values; the grid is their product (one :class:`CellSpec` per point).

    Rows are ``tokens`` (N = B·T) or, instead, ``batch`` × ``seq`` (both lists; every
    pair is one N). Shapes: ``vocab`` (V), ``hidden`` (H). ``backends``: built-in names
    or ``"module:callable"``. ``modes``: any of ``amp-bf16``, ``amp-fp16``, ``bf16``,
    ``fp32``. Options, each a list: ``bias``, ``ignore_frac`` (fraction of targets set to
    the ignore index, in [0, 1)), ``label_smoothing`` ([0, 1)), ``z_loss`` (≥ 0),
    ``softcap`` (> 0, or ``None`` for none). ``device``: ``cuda``, ``cuda:K`` or ``cpu``
    (default: CUDA if present). ``warmup`` / ``repeats``: untimed / timed steps per cell.
    """

    tokens: tuple[int, ...] = (1024, 4096)
    vocab: tuple[int, ...] = (32768,)
    hidden: tuple[int, ...] = (768,)
    backends: tuple[str, ...] = ("torch", "fusedce")
    modes: tuple[str, ...] = ("amp-bf16",)
    device: str = field(default_factory=default_device)
    batch: tuple[int, ...] | None = None
    seq: tuple[int, ...] | None = None
    bias: tuple[bool, ...] = (False,)
    ignore_frac: tuple[float, ...] = (0.0,)
    label_smoothing: tuple[float, ...] = (0.0,)
    z_loss: tuple[float, ...] = (0.0,)
    softcap: tuple[float | None, ...] = (None,)
    reduction: str = "mean"
    seed: int = 0
    warmup: int = 1
    repeats: int = 5

    def __post_init__(self) -> None:
        # Lightning's precision names ("bf16-mixed") stand for the modes they mean; validate() refuses the rest.
        if isinstance(self.modes, (tuple, list)):
            object.__setattr__(self, "modes", tuple(LIGHTNING_ALIASES.get(m, m) if isinstance(m, str) else m
                                                    for m in self.modes))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and value."""
        if (self.batch is None) != (self.seq is None):
            raise ValueError("batch and seq go together: give both, or give tokens")
        rows = {"tokens": self.tokens} if self.batch is None else {"batch": self.batch, "seq": self.seq}
        for name, values in {**rows, "vocab": self.vocab, "hidden": self.hidden}.items():
            _nonempty(name, values)
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name}: {value!r} is not a positive integer")
        _nonempty("backends", self.backends)
        for name in self.backends:
            get_backend(name)
        _nonempty("modes", self.modes)
        for mode in self.modes:
            canonical_mode(mode, what="modes:")
        kind, _, index = self.device.partition(":")
        if kind not in ("cuda", "cpu") or (index and (kind == "cpu" or not index.isdigit())):
            raise ValueError(f"device: {self.device!r} is not 'cuda', 'cuda:K' or 'cpu'")
        if kind == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {self.device!r} was asked for but no CUDA device is visible")
        if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
            raise ValueError(f"device: {self.device!r} does not exist; this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        _check_range("ignore_frac", self.ignore_frac, 0.0, 1.0)
        _check_range("label_smoothing", self.label_smoothing, 0.0, 1.0)
        _nonempty("z_loss", self.z_loss)
        if any(z < 0 for z in self.z_loss):
            raise ValueError(f"z_loss: {self.z_loss} has a negative value")
        _nonempty("softcap", self.softcap)
        if any(c is not None and not c > 0 for c in self.softcap):
            raise ValueError(f"softcap: {self.softcap} must be positive (or None for no soft-cap)")
        _nonempty("bias", self.bias)
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction: {self.reduction!r} is not one of {', '.join(REDUCTIONS)}")
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"warmup must be >= 0 and repeats >= 1 (got {self.warmup}, {self.repeats})")
        too_much = capacity.grid_problem(self.cell_count(), self.repeats)
        if too_much:
            raise ValueError(too_much)

    def cell_count(self) -> int:
        """How many cells the grid has (the product of its lists' lengths; none is built)."""
        rows = len(self.tokens) if self.batch is None else len(self.batch) * len(self.seq)
        return math.prod(len(values) for values in (
            self.hidden, self.vocab, self.modes, self.bias, self.ignore_frac, self.label_smoothing, self.z_loss,
            self.softcap, self.backends)) * rows

    def _rows(self) -> list[tuple[int, int | None, int | None]]:
        if self.batch is None:
            return [(n, None, None) for n in self.tokens]
        return sorted((b * t, b, t) for b, t in itertools.product(self.batch, self.seq))

    def cells(self) -> list[CellSpec]:
        """The validated grid: shape by shape, tokens in the order given (B·T ascending),
        back-ends side by side."""
        self.validate()
        cells = []
        for hidden, vocab, (tokens, batch, seq), mode, bias, ignore, smooth, z, cap, backend in itertools.product(
                self.hidden, self.vocab, self._rows(), self.modes, self.bias, self.ignore_frac,
                self.label_smoothing, self.z_loss, self.softcap, self.backends):
            cells.append(CellSpec(backend=backend, tokens=tokens, vocab=vocab, hidden=hidden, mode=mode,
                                  device=self.device, bias=bias, ignore_frac=ignore, label_smoothing=smooth,
                                  z_loss=z, softcap=cap, reduction=self.reduction, batch=batch, seq=seq,
                                  seed=self.seed))
        return cells


def _nonempty(name: str, values) -> None:
    if not values:
        raise ValueError(f"{name}: give at least one value")


def _check_range(name: str, values, low: float, high: float) -> None:
    _nonempty(name, values)
    for value in values:
        if not low <= value < high:
            raise ValueError(f"{name}: {value!r} is outside [{low}, {high})")
