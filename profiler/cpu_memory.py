"""Peak tensor memory on the CPU, from PyTorch's own allocator accounting.

How it works: ``torch.profiler.profile(profile_memory=True)`` makes the CPU allocator
report every allocation and free (size in bytes, signed) to the profiler, inside ops and
inside autograd alike (on the CPU the autograd engine runs backward on the calling
thread, so forward and backward are both seen). Sorting those events by time and summing them
gives the bytes allocated over time relative to the moment profiling started; the
maximum of that running sum is the peak extra over the baseline, exactly as
``max_memory_allocated() - memory_allocated()`` on CUDA. Named phases (forward,
backward) are ``record_function`` ranges: an event belongs to the last phase that
started before it.

Blocks allocated before profiling started are never reported when freed, so everything
that is freed during the measured step must be allocated inside it: the caller clears
``.grad`` and drops earlier outputs first. This counts tensor storage only (what the
CUDA figures count too), not the Python heap nor the allocator's own caches.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from torch.profiler import ProfilerActivity, profile, record_function

_PHASE_PREFIX = "fusedce-profile::"


@dataclass
class CpuMemoryTrace:
    """Running allocated bytes over the measured region.

    ``peak_bytes``: max over the whole region; ``phase_peak_bytes``: max within each
    phase; ``end_bytes``: net bytes still allocated at the end (e.g. the gradients).
    ``events``: (time_ns, signed bytes, phase) in time order.
    """

    peak_bytes: int = 0
    end_bytes: int = 0
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)
    events: list[tuple[int, int, str]] = field(default_factory=list)


class CpuMemoryMeter:
    """Context manager measuring peak CPU tensor memory; phases via :meth:`phase`.

    >>> with CpuMemoryMeter() as meter:
    ...     with meter.phase("forward"): loss = f()
    ...     with meter.phase("backward"): loss.backward()
    >>> meter.trace.peak_bytes
    """

    def __init__(self) -> None:
        self.trace = CpuMemoryTrace()
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> "CpuMemoryMeter":
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        if exc[0] is None:
            self.trace = _trace_from(self._prof)

    @staticmethod
    def phase(name: str) -> contextlib.AbstractContextManager:
        return record_function(_PHASE_PREFIX + name)


def _trace_from(prof) -> CpuMemoryTrace:
    from torch._C._profiler import _EventType

    allocations: list[tuple[int, int]] = []
    phases: list[tuple[int, str]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            allocations.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
        elif node.name.startswith(_PHASE_PREFIX):
            phases.append((node.start_time_ns, node.name[len(_PHASE_PREFIX):]))
        stack.extend(node.children)
    allocations.sort()
    phases.sort()
    trace = CpuMemoryTrace()
    current, phase_index = 0, -1
    for time_ns, size in allocations:
        while phase_index + 1 < len(phases) and phases[phase_index + 1][0] <= time_ns:
            phase_index += 1
            trace.phase_peak_bytes.setdefault(phases[phase_index][1], current)
        phase = phases[phase_index][1] if phase_index >= 0 else ""
        current += size
        trace.peak_bytes = max(trace.peak_bytes, current)
        if phase:
            trace.phase_peak_bytes[phase] = max(trace.phase_peak_bytes.get(phase, current), current)
        trace.events.append((time_ns, size, phase))
    trace.end_bytes = current
    return trace
