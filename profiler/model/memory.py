"""Phase-by-phase memory accounting of one training step, on CUDA or on the CPU.

A :class:`PhaseMeter` is told where the step's phases begin (``mark("forward")``,
``mark("loss")``, ...) and reports, per phase, the bytes allocated when it started and
ended and the peak allocated in between — all absolute (bytes of live tensors).

- CUDA: the caching allocator's own counters (``memory_allocated``, ``max_memory_allocated``
  reset at each mark, ``max_memory_reserved``).
- CPU: PyTorch's CPU allocator reports every allocation and free to the profiler when it
  records memory (``profile_memory=True``); the meter records the whole run and replays
  those events afterwards, with a zero-length marker event at each mark. Tensors allocated
  before the meter started are not seen: the caller passes their bytes as ``baseline_bytes``.

This is the model mode's own small accounting; the grid profiler measures single loss calls
and keeps its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_MARK_PREFIX = "fusedce.mark:"


@dataclass
class Phase:
    """One phase of the step: allocated bytes at its start and end, and its peak."""

    name: str
    start_bytes: int
    end_bytes: int
    peak_bytes: int


@dataclass
class PhaseRecord:
    """All phases in order, plus the allocator's reserved bytes (CUDA only, else ``None``)."""

    phases: list[Phase] = field(default_factory=list)
    peak_reserved_bytes: int | None = None
    source: str = "cuda-allocator"

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; phases: {[p.name for p in self.phases]}")

    @property
    def peak(self) -> Phase:
        """The phase holding the highest peak (the first one on ties)."""
        return max(self.phases, key=lambda p: p.peak_bytes)


class PhaseMeter:
    """Context manager: ``with PhaseMeter(device) as meter: meter.mark("forward"); ...``.

    The first ``mark`` opens the first phase; each later one closes the open phase and
    opens the next; leaving the context closes the last one. ``record`` is filled on exit.
    """

    def __init__(self, device: torch.device | str, baseline_bytes: int = 0) -> None:
        self.device = torch.device(device)
        self.baseline_bytes = baseline_bytes  # CPU only: bytes alive before the meter started
        self.record = PhaseRecord(source="cuda-allocator" if self.device.type == "cuda" else "cpu-profiler")
        self._names: list[str] = []
        self._profiler = None
        self._open: tuple[str, int] | None = None
        self._reserved = 0  # CUDA: max reserved seen so far (the peak counters reset at each mark)

    def __enter__(self) -> "PhaseMeter":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def mark(self, name: str) -> None:
        """End the open phase (if any) here and begin phase ``name``."""
        self._names.append(name)
        if self.device.type == "cuda":
            now = torch.cuda.memory_allocated(self.device)
            if self._open is not None:
                self._close_cuda(now)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._reserved = max(self._reserved, torch.cuda.max_memory_reserved(self.device))
            self._open = (name, now)
        else:
            with torch.profiler.record_function(_MARK_PREFIX + name):
                pass

    def _close_cuda(self, now: int) -> None:
        name, start = self._open
        peak = max(torch.cuda.max_memory_allocated(self.device), start, now)
        self.record.phases.append(Phase(name, start, now, peak))
        self._reserved = max(self._reserved, torch.cuda.max_memory_reserved(self.device))

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            if self._open is not None:
                self._close_cuda(torch.cuda.memory_allocated(self.device))
            self.record.peak_reserved_bytes = self._reserved
            return
        self._profiler.__exit__(*exc)
        if exc[0] is None:
            self.record.phases = _replay_cpu_events(self._profiler, self._names, self.baseline_bytes)


def _replay_cpu_events(prof, names: list[str], baseline: int) -> list[Phase]:
    """Turn the profiler's CPU memory events and our markers into phases."""
    timeline: list[tuple[int, int, str | None]] = []  # (time ns, byte delta, marker name)
    for event in prof.profiler.kineto_results.events():
        event_name = event.name()
        if event_name == "[memory]":
            if event.device_type() == torch.autograd.DeviceType.CPU:
                timeline.append((event.start_ns(), event.nbytes(), None))
        elif event_name.startswith(_MARK_PREFIX):
            timeline.append((event.start_ns(), 0, event_name[len(_MARK_PREFIX):]))
    timeline.sort(key=lambda item: item[0])
    phases: list[Phase] = []
    allocated = baseline
    current: Phase | None = None
    for _, delta, marker in timeline:
        if marker is not None:
            if current is not None:
                current.end_bytes = allocated
                phases.append(current)
            current = Phase(marker, allocated, allocated, allocated)
            continue
        allocated += delta
        if current is not None:
            current.peak_bytes = max(current.peak_bytes, allocated)
    if current is not None:
        current.end_bytes = allocated
        phases.append(current)
    found = [p.name for p in phases]
    if found != names:
        raise RuntimeError(f"CPU memory replay found markers {found}, expected {names}")
    return phases
