"""The built-in default run of ``fusedce-profile`` (no arguments).

On a GPU: the user's model head (H = 768, V = 32777, the model behind the "only 600 MB
saved" report) and the Llama-3 head (H = 4096, V = 128256), tokens from 1k upward by
in steps of 4×, every installed back-end, ``amp-bf16`` (fp32 weight under bf16 autocast, as
Lightning's ``bf16-mixed`` runs). A few minutes on one H200.

On the CPU: the user's head at 512 to 2048 tokens with the back-ends that
run on the CPU, in about a minute on a laptop.

Each head is its own :class:`GridSpec` (a single grid would pair every H with every V).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from fusedce_profiler.instrument.backends import list_backends
from fusedce_profiler.grid.spec import GridSpec

USER_HEAD = (768, 32777)
LLAMA3_HEAD = (4096, 128256)

GPU_HEADS = (USER_HEAD, LLAMA3_HEAD)
GPU_TOKENS = (1024, 4096, 16384, 65536)

CPU_HEADS = (USER_HEAD,)
CPU_TOKENS = (512, 1024, 2048)
CPU_BACKENDS = ("torch", "torch-compile", "fusedce")
"""torch-native is left out of the CPU default: its chunked CPU path takes seconds per
step at these sizes (``grid --backend torch-native`` measures it)."""
CPU_REPEATS = 3

SMOKE_ENV = "FUSEDCE_PROFILE_SMOKE"
"""Set to 1 to shrink the default run to seconds (tests and CI only; not for measuring)."""
SMOKE_HEADS = ((64, 512),)
SMOKE_TOKENS = (32, 64)
SMOKE_BACKENDS = ("torch", "fusedce")


@dataclass(frozen=True)
class DefaultRun:
    """The grids of the default run and a one-line description for the terminal."""

    grids: tuple[GridSpec, ...]
    description: str


# fusedce's other frontier points are asked for by name (``--backend fusedce-min``): the default
# run compares fusedce's default point with every alternative, and keeps its cell count.
OPT_IN_BACKENDS = ("fusedce-min", "fusedce-fast")


def installed_backends(device: str) -> list[str]:
    """Names of the built-in back-ends that are installed and run on ``device``, without the
    opt-in ones (:data:`OPT_IN_BACKENDS`)."""
    kind = device.split(":")[0]
    return [info.name for info in list_backends()
            if info.available and kind in info.devices and info.name not in OPT_IN_BACKENDS]


def default_run(device: str, heads: tuple[tuple[int, int], ...] | None = None,
                softcap: float | None = None) -> DefaultRun:
    """The default grids for ``device`` (``cuda``/``cuda:K``/``cpu``).

    ``heads`` ((H, V) pairs, e.g. from ``--preset``) replaces the built-in heads;
    ``softcap`` applies a model's final-logit soft-cap to every cell.
    """
    smoke = os.environ.get(SMOKE_ENV, "") not in ("", "0")
    on_gpu = device.startswith("cuda")
    installed = installed_backends(device)
    if smoke:
        built_in, tokens, backends, repeats = SMOKE_HEADS, SMOKE_TOKENS, SMOKE_BACKENDS, 1
    elif on_gpu:
        built_in, tokens, backends, repeats = GPU_HEADS, GPU_TOKENS, tuple(installed), GridSpec.repeats
    else:
        backends = tuple(b for b in CPU_BACKENDS if b in installed)
        built_in, tokens, repeats = CPU_HEADS, CPU_TOKENS, CPU_REPEATS
    heads = heads or built_in
    grids = tuple(
        GridSpec(tokens=tokens, vocab=(vocab,), hidden=(hidden,), backends=backends, modes=("amp-bf16",),
                 device=device, softcap=(softcap,), repeats=repeats)
        for hidden, vocab in heads
    )
    head_text = ", ".join(f"H={h} V={v}" for h, v in heads)
    description = (f"{'smoke test' if smoke else 'default run'} on {device}: {head_text}; tokens "
                   f"{', '.join(str(t) for t in tokens)}; amp-bf16; back-ends {', '.join(backends)}")
    return DefaultRun(grids, description)


CELL_TIMEOUT_S = {"cuda": 900.0, "cpu": 600.0}
"""Default ``cell_timeout`` per device kind: far above a real cell (seconds to a minute),
short enough that a hung back-end does not hold a CI job for hours."""


def resolve_cell_timeout(seconds: float | None, device: str) -> float | None:
    """``cell_timeout`` in seconds (``None``: no limit), its default for ``device`` when not given."""
    if seconds is None:
        return CELL_TIMEOUT_S[device.split(":")[0]]
    return seconds or None
