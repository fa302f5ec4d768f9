"""What the ANCHORS protocol fixes: the rows, the precision modes, the inputs, the floors.

A *row* is one N×H×V shape (tokens × hidden × vocabulary). A *mode* is how the LM head
runs in training:

- ``amp-bf16`` ("amp"): the weight is fp32 (master weights), the forward runs under
  ``torch.autocast(dtype=torch.bfloat16)``; grad_weight is fp32.
- ``bf16``: the weight is stored in bf16, no autocast; grad_weight is bf16.

The hidden states are bf16 and require grad in both modes.

Floors (``../shared/ANCHORS.md``):

- memory floor = bytes of the gradients that must exist at the end:
  grad_hidden (N·H·2) + grad_weight (V·H·4 amp / V·H·2 bf16) [+ grad_bias (V·4 / V·2)];
- time floor = :func:`step_flops` (6·N·H·V: logits, grad_hidden, grad_weight) at the
  measured bf16 GEMM rate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from fusedce.planner import gradient_floor_bytes
from fusedce.options import IGNORE_INDEX
from fusedce_profiler.grid.inputs import CellInputs

MIB = 1 << 20
GIB = 1 << 30

# The memory goal: peak extra ≤ MEMORY_GOAL_FACTOR · floor + MEMORY_GOAL_SLACK_BYTES.
MEMORY_GOAL_FACTOR = 1.10
MEMORY_GOAL_SLACK_BYTES = 128 * MIB
# Stretch of the speed goal: at least this fraction of the measured bf16 GEMM rate on 6·N·H·V.
GEMM_STRETCH_FRACTION = 0.80

# The options that ``--all-options`` turns on (the options goal).
ALL_OPTIONS_LABEL_SMOOTHING = 0.1
ALL_OPTIONS_Z_LOSS = 1e-4
ALL_OPTIONS_SOFTCAP = 30.0

MODES = {"amp": "amp-bf16", "bf16": "bf16"}  # command-line name -> CellSpec.mode
MODE_LABELS = {spec: name for name, spec in MODES.items()}


@dataclass(frozen=True)
class Row:
    """One N×H×V shape of the benchmark; ``label`` names the model it comes from."""

    tokens: int
    hidden: int
    vocab: int
    label: str = ""

    def __post_init__(self) -> None:
        for key in ("tokens", "hidden", "vocab"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Row.{key} must be a positive integer, got {value!r}")

    @property
    def shape(self) -> str:
        return f"{self.tokens}x{self.hidden}x{self.vocab}"


ANCHOR_ROWS = (
    Row(8192, 768, 32777, "the user's model"),
    Row(8192, 2304, 256000, "Gemma-2-2B head"),
    Row(8192, 4096, 128256, "Llama-3-8B head"),
    Row(32768, 4096, 128256, ""),
)

_ROW_PATTERN = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*[x×]\s*(\d+)\s*$")


def parse_row(text: str) -> Row:
    """``"8192x768x32777"`` (N×H×V) -> :class:`Row`; an anchor row keeps its label."""
    match = _ROW_PATTERN.match(text)
    if match is None:
        raise ValueError(f"row {text!r} is not of the form NxHxV (e.g. 8192x768x32777)")
    tokens, hidden, vocab = (int(g) for g in match.groups())
    for row in ANCHOR_ROWS:
        if (row.tokens, row.hidden, row.vocab) == (tokens, hidden, vocab):
            return row
    return Row(tokens, hidden, vocab)


def weight_dtype(mode: str) -> torch.dtype:
    """The dtype the weight (and bias) is stored in for ``mode`` (a CellSpec mode)."""
    if mode == "amp-bf16":
        return torch.float32
    if mode == "bf16":
        return torch.bfloat16
    raise ValueError(f"mode must be one of {sorted(MODE_LABELS)}, got {mode!r}")


def floor_bytes(row: Row, mode: str, *, bias: bool = False) -> int:
    """Bytes of grad_hidden (bf16) + grad_weight (+ grad_bias) in the weight's dtype (the one
    floor formula, :func:`fusedce.planner.gradient_floor_bytes`)."""
    return gradient_floor_bytes(row.tokens, row.hidden, row.vocab, torch.bfloat16, weight_dtype(mode), has_bias=bias)


def memory_goal_bytes(floor: int) -> float:
    """The largest peak extra (bytes) that meets goal 1: 1.10 × floor + 128 MiB."""
    return MEMORY_GOAL_FACTOR * floor + MEMORY_GOAL_SLACK_BYTES


def step_flops(row: Row) -> int:
    """FLOPs of one forward+backward without recomputation: 6·N·H·V (three GEMMs)."""
    return 6 * row.tokens * row.hidden * row.vocab


def tflops(flops: int, ms: float) -> float:
    """FLOPs done in ``ms`` milliseconds, as TFLOP/s."""
    return flops / (ms * 1e-3) / 1e12


def make_inputs(row: Row, mode: str, *, device: str, seed: int = 0, ignore_frac: float = 0.0,
                bias: bool = False) -> CellInputs:
    """Deterministic inputs: h ~ N(0, 1), W ~ N(0, 1/H) (logits of unit scale), b ~ N(0, 1).

    hidden: (N, H) bf16, requires grad. weight: (V, H) fp32 (amp) or bf16, requires grad.
    target: (N,) int64 in [0, V) or ``IGNORE_INDEX``. bias: (V,) in the weight's dtype or None.
    The weight is drawn in fp32 and rounded for ``bf16``, so both modes see the same values
    up to that rounding. Exactly ``round(ignore_frac · N)`` targets are ``IGNORE_INDEX``.
    (Not :func:`fusedce_profiler.grid.inputs.make_inputs`: the committed results were drawn this way.)
    """
    if not 0.0 <= ignore_frac <= 1.0:
        raise ValueError(f"ignore_frac must be in [0, 1], got {ignore_frac!r}")
    w_dtype = weight_dtype(mode)
    gen = torch.Generator(device=device).manual_seed(seed)
    n, h, v = row.tokens, row.hidden, row.vocab
    hidden = torch.randn(n, h, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
    weight = torch.randn(v, h, generator=gen, device=device, dtype=torch.float32).mul_(h ** -0.5)
    weight = weight.to(w_dtype)
    target = torch.randint(0, v, (n,), generator=gen, device=device)
    n_ignored = round(ignore_frac * n)
    if n_ignored:
        ignored = torch.randperm(n, generator=gen, device=device)[:n_ignored]
        target[ignored] = IGNORE_INDEX
    b = torch.randn(v, generator=gen, device=device).to(w_dtype) if bias else None
    return CellInputs(
        hidden=hidden.requires_grad_(),
        weight=weight.requires_grad_(),
        target=target,
        bias=b.requires_grad_() if b is not None else None,
    )
