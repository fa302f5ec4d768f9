"""``explain``'s input checks: readings and options that cannot describe a real run, refused in
one line before anything is measured.

Every check raises ``ValueError`` whose message names the option and what was expected; the
public API turns it into its ``UsageError`` (exit 2 on the command line).
"""
from __future__ import annotations

from fusedce_profiler.judgements.explain.records import Observation

LARGEST_CARD_GIB = 512
"""No GPU has more memory than this (an H200 has 141 GB, a B200 192 GB): a larger ``--card``
is a size typed in MiB."""


SMALLEST_CONTEXT_MIB = 256
"""Less than the CUDA context of any GPU (≈ 300–600 MiB): no training process reads below it in nvidia-smi."""


def check_readings_are_mib(obs: Observation) -> None:
    """Refuse GPU readings below :data:`SMALLEST_CONTEXT_MIB`: GiB typed where MiB are asked for
    (explanations on the CPU, of a small model's predicted bytes, are not held to it)."""
    for name, option in (("naive_mib", "--naive"), ("fused_mib", "--fused")):
        value = getattr(obs, name)
        if value < SMALLEST_CONTEXT_MIB:
            raise ValueError(f"{option} takes MiB, as nvidia-smi shows them: {value:g} is below the CUDA context of "
                             f"any GPU ({SMALLEST_CONTEXT_MIB} MiB); {value:g} GiB would be {value * 1024:,.0f} MiB")


def check_observation(obs: Observation) -> None:
    """Refuse readings no run can produce: non-positive numbers, a card size typed in MiB, a
    reading above the card, a fused reading above the naive one that the user did not confirm
    (``fused_larger``), a stated context larger than the reading."""
    for name, option in (("naive_mib", "--naive"), ("fused_mib", "--fused"), ("total_gib", "--card")):
        value = getattr(obs, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{option} must be a positive number, got {value!r}")
    if obs.total_gib > LARGEST_CARD_GIB:
        raise ValueError(f"--card takes GiB: {obs.total_gib:g} looks like MiB "
                         f"({obs.total_gib:g} MiB = {obs.total_gib / 1024:g} GiB); no GPU has more than "
                         f"{LARGEST_CARD_GIB} GiB")
    card_mib = obs.total_gib * 1024
    for name, option in (("naive_mib", "--naive"), ("fused_mib", "--fused")):
        value = getattr(obs, name)
        if value > card_mib:
            raise ValueError(f"{option} {value:g} MiB is above the {obs.total_gib:g} GiB card ({card_mib:,.0f} "
                             "MiB): nvidia-smi cannot show more than the card holds; check --card (GiB) and the "
                             "reading (MiB)")
    if obs.fused_mib > obs.naive_mib and not obs.fused_larger:
        raise ValueError(f"--fused {obs.fused_mib:g} MiB is above --naive {obs.naive_mib:g} MiB: swapped? "
                         "(pass --fused-larger if the fused loss really showed more)")
    if obs.context_mib is not None and not 0 < obs.context_mib < min(obs.naive_mib, obs.fused_mib):
        raise ValueError(f"--context-mib must be positive and below both readings, got {obs.context_mib:g}")
    if obs.attention is not None and obs.attention not in ("eager", "sdpa"):
        raise ValueError(f"--attention must be eager or sdpa, got {obs.attention!r}")


def runnable_sequences(candidates: tuple[int, ...], stated: int | None, max_positions: int) -> tuple[int, ...]:
    """The sequence lengths to consider: the stated one, else the candidates the model can run.

    A stated ``--seq`` beyond the model's positions, or candidates all beyond them, are
    refused: the model cannot measure them, and a shorter stand-in would be extrapolation.
    """
    if stated is not None:
        if stated > max_positions:
            raise ValueError(f"--seq {stated} is longer than the model's {max_positions} positions: it cannot run "
                             "that sequence length; name the model the readings came from (--preset/--config/"
                             "--hf/--model)")
        return (stated,)
    runnable = tuple(s for s in candidates if s <= max_positions)
    if not runnable:
        raise ValueError(f"--seq-candidates {','.join(map(str, candidates))}: every length is longer than the "
                         f"model's {max_positions} positions; name the model the readings came from or give "
                         "--seq")
    return runnable
