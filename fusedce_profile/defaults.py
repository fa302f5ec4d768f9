"""The built-in default run of ``fusedce-profile`` (no arguments).

On a GPU: the user's model head (H = 768, V = 32777, the model behind the "only 600 MB
saved" report) and the Llama-3 head (H = 4096, V = 128256), tokens from 1k upward by
in steps of 4×, every installed back-end, ``amp-bf16`` (fp32 weight under bf16 autocast, as
Lightning's ``bf16-mixed`` runs). A few minutes on one H200.

On the CPU: the user's head at 512 to 2048 tokens with the back-ends that
run on the CPU, in about a minute on a laptop; in fp32 instead of amp-bf16 on a CPU without a
native bf16 matrix product (:func:`cpu_bf16_slowdown`), where bf16 runs two orders of magnitude slower.

Each head is its own :class:`GridSpec` (a single grid would pair every H with every V).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, installed_versions
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


SLOW_BF16_RATIO = 8.0
"""A CPU whose bf16 matrix product takes this many times its fp32 one has no native bf16 path
(an AVX2-only CPU: measured 105× at 512 × 32777 × 768, 89 s against 0.84 s); the default CPU run
then measures fp32, where amp-bf16 would take minutes a step."""


def cpu_bf16_slowdown(shape: tuple[int, int, int] = (64, 768, 2048), repeats: int = 1) -> float:
    """How many times slower this CPU computes an (M, K) @ (K, N) product of ``shape`` in bf16 than
    in fp32 (the fastest of ``repeats`` each, after one warm-up): about 1 with a native bf16 path
    (AMX, AVX-512 BF16), far above :data:`SLOW_BF16_RATIO` without one. The default shape is a
    slice of the loss's own product (H = 768): on an AVX2-only CPU square 256 × 256 products showed
    1.5×, 64 × 768 × 1024 9×, this shape 45× (0.75 s there, a few ms elsewhere)."""
    import time

    import torch

    m, k, n = shape

    def fastest(dtype) -> float:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return fastest(torch.bfloat16) / max(fastest(torch.float32), 1e-9)


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
    return [name for name, version in installed_versions().items()
            if version is not None and kind in BUILTIN_BACKENDS[name].devices and name not in OPT_IN_BACKENDS]


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
    mode, why = "amp-bf16", ""
    if not on_gpu and not smoke:
        slowdown = cpu_bf16_slowdown()
        if slowdown > SLOW_BF16_RATIO:
            mode, why = "fp32", (f" (this CPU multiplies bf16 {slowdown:.0f}× slower than fp32: no native bf16 path, "
                                 "so amp-bf16 would take minutes a step; `fusedce-profile grid --mode amp-bf16` measures it)")
    heads = heads or built_in
    grids = tuple(
        GridSpec(tokens=tokens, vocab=(vocab,), hidden=(hidden,), backends=backends, modes=(mode,),
                 device=device, softcap=(softcap,), repeats=repeats)
        for hidden, vocab in heads
    )
    head_text = ", ".join(f"H={h} V={v}" for h, v in heads)
    description = (f"{'smoke test' if smoke else 'default run'} on {device}: {head_text}; tokens "
                   f"{', '.join(str(t) for t in tokens)}; {mode}{why}; back-ends {', '.join(backends)}")
    return DefaultRun(grids, description)


CELL_TIMEOUT_S = {"cuda": 900.0, "cpu": 600.0}
"""Default ``cell_timeout`` per device kind: far above a real cell (seconds to a minute),
short enough that a hung back-end does not hold a CI job for hours."""


def resolve_cell_timeout(seconds: float | None, device: str) -> float | None:
    """``cell_timeout`` in seconds (``None``: no limit), its default for ``device`` when not given."""
    if seconds is None:
        return CELL_TIMEOUT_S[device.split(":")[0]]
    return seconds or None
