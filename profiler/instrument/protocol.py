"""The measurement protocol: how every figure of memory and time in this project is taken.

One protocol serves the grid cells (:mod:`fusedce_profiler.grid.cell`), the training steps
(:mod:`fusedce_profiler.instrument.step.step`), the benchmarks and the GPU tests:

1. **Settle** (:func:`settle`): ``gc.collect()``; on CUDA ``synchronize()``,
   ``empty_cache()`` and ``reset_peak_memory_stats()``, so the measured region starts from
   live tensors only and a fresh peak.
2. **Meter the phases** (:class:`MemoryMeter`): ``meter.mark(name)`` ends the open phase and
   begins the next; each :class:`Phase` records the bytes of live tensors at its start and
   end and the peak in between, all absolute.

   - CUDA: the caching allocator's own counters (``memory_allocated``;
     ``max_memory_allocated`` reset at each mark; ``max_memory_reserved``).
   - CPU: PyTorch's CPU allocator reports every allocation and free to the profiler when it
     records memory (``profile_memory=True``); the meter records the region and replays those
     events afterwards, with a zero-length marker at each mark. Tensors allocated before the
     meter started are not seen: the caller passes their bytes as ``baseline_bytes``, and
     anything freed inside the region must have been allocated inside it (clear ``.grad``
     and drop earlier outputs first). This counts tensor storage (what the CUDA counters
     count too), not the Python heap nor the allocator's own cache.
3. **Time** (:func:`time_calls`): each call bracketed by CUDA events (the wall clock on the
   CPU), after the warm-up, with per-call set-up (``before``) outside the timed region.

On the CPU a worker runs with :data:`CPU_WORKER_ENV`: its C allocator keeps the blocks a step
frees for the next step, and hands them back to the system when a cell ends
(:func:`release_freed_memory`); its OpenMP threads sleep between parallel regions instead of
spinning. This moves no figure of memory (the meter counts tensor storage, not the process's
pages) and takes the kernel's page faults and the spinning out of the repeated steps.

Peak extra over a baseline — what the grid reports — is ``phase.peak_bytes - baseline``.

Public API: :func:`settle`, :class:`MemoryMeter`, :class:`MemoryRecord`, :class:`Phase`,
:func:`time_calls`, :func:`synchronize`, :data:`CPU_WORKER_ENV`, :data:`CPU_WORKER_WARM_UP`,
:func:`warm_up_cpu_meter`, :func:`import_custom_op_layer`, :func:`release_freed_memory`.
"""
from __future__ import annotations

import ctypes
import functools
import gc
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from fusedce_profiler.instrument.tracing.names import readable
from fusedce_profiler.instrument.tracing.quiet import quiet_third_party

CUDA_ALLOCATOR = "cuda-allocator"
CPU_PROFILER = "cpu-profiler"
MARK_PREFIX = "fusedce.mark:"


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def settle(device: str | torch.device) -> None:
    """Step 1 of the protocol: collect garbage; on CUDA empty the cache and reset the peaks."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


CPU_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
                  "OMP_WAIT_POLICY": "PASSIVE"}
"""Environment of a process that measures CPU cells (the caller's own values of these win).

- ``MALLOC_*`` (glibc's malloc; other C libraries ignore them): by default glibc serves every
  block above 32 MiB with a fresh ``mmap`` and unmaps it on free, so each step's logits (2048 ×
  32777 fp32: 268 MiB) are page-faulted in, zeroed by the kernel and unmapped again: a third
  of a default CPU run's CPU time was system time. Below 4 GiB blocks now come from the heap,
  and a freed block stays there for the next step's allocation of the same size.
- ``OMP_WAIT_POLICY``: an OpenMP thread that has finished its share of a parallel region
  sleeps until the next one instead of spinning. On a two-core machine that other processes
  share, a spinning thread holds the core its partner needs to finish: an elementwise op over
  1 M elements took ~200 ms instead of ~12 ms, and a step twice its time."""


def warm_up_cpu_meter() -> None:
    """Start and stop a :class:`MemoryMeter` on the CPU once, untimed: its first start sets up
    the profiler. A CPU worker calls this before it says it is ready (:data:`CPU_WORKER_WARM_UP`),
    so its first cell's time limit counts none of it."""
    with MemoryMeter("cpu") as meter:
        meter.mark("warm-up")


def import_custom_op_layer() -> None:
    """Import fusedce's loss (``import fusedce`` alone leaves it to first use) and ``torch._dynamo``,
    as the first call of any torch custom op does (fusedce's loss is one: torch's dispatch wraps it
    in ``torch.compiler.disable``): 1.3 s of CPU that a CPU worker's first fusedce cell would
    otherwise count in its time limit."""
    import torch._dynamo  # noqa: F401

    import fusedce.api  # noqa: F401


CPU_WORKER_WARM_UP = ("fusedce_profiler.instrument.protocol:warm_up_cpu_meter",
                      "fusedce_profiler.instrument.protocol:import_custom_op_layer")
"""What a process that measures CPU cells runs before its first job (see
:class:`~fusedce_profiler.instrument.worker.Worker`'s ``warm_up``)."""


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        return None


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere): after a cell under :data:`CPU_WORKER_ENV`, what its steps freed."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def memory_source(device: str | torch.device) -> str:
    """Whose accounting the figures of ``device`` come from: ``cuda-allocator`` or ``cpu-profiler``."""
    return CUDA_ALLOCATOR if torch.device(device).type == "cuda" else CPU_PROFILER


@dataclass
class Phase:
    """One phase of a measured region: bytes of live tensors at its start and end, and its peak."""

    name: str
    start_bytes: int
    end_bytes: int
    peak_bytes: int


@dataclass
class MemoryRecord:
    """What a :class:`MemoryMeter` measured.

    ``phases`` in order; ``baseline_bytes``: live bytes when the meter started (CUDA: read
    from the allocator; CPU: as the caller passed it); ``peak_reserved_bytes``: the caching
    allocator's high-water mark of reserved bytes over the region (CUDA only, else ``None``);
    ``source``: :func:`memory_source` of the device.
    """

    phases: list[Phase] = field(default_factory=list)
    baseline_bytes: int = 0
    peak_reserved_bytes: int | None = None
    source: str = CUDA_ALLOCATOR

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; phases: {[p.name for p in self.phases]}")

    @property
    def peak_bytes(self) -> int:
        """The highest live bytes of the region (absolute)."""
        return max((p.peak_bytes for p in self.phases), default=self.baseline_bytes)

    @property
    def peak_phase(self) -> Phase:
        """The phase holding the highest peak (the first one on ties)."""
        return max(self.phases, key=lambda p: p.peak_bytes)

    def extra(self, name: str | None = None) -> int:
        """Peak over the baseline: of phase ``name``, or of the whole region."""
        peak = self.phase(name).peak_bytes if name is not None else self.peak_bytes
        return peak - self.baseline_bytes


class MemoryMeter:
    """Step 2 of the protocol. ``with MemoryMeter(device) as meter: meter.mark("forward"); ...``

    The first :meth:`mark` opens the first phase; each later one closes the open phase and
    opens the next; leaving the context closes the last one. ``record`` is complete after
    the context exits. Marks may come from hooks inside autograd (e.g. a tensor hook that
    fires when backward reaches the hidden states).
    """

    def __init__(self, device: str | torch.device, baseline_bytes: int = 0) -> None:
        self.device = torch.device(device)
        self.record = MemoryRecord(source=memory_source(self.device), baseline_bytes=baseline_bytes)
        self._names: list[str] = []
        self._profiler = None
        self._open: tuple[str, int] | None = None
        self._reserved = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def __enter__(self) -> "MemoryMeter":
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.record.baseline_bytes = torch.cuda.memory_allocated(self.device)
            self._reserved = torch.cuda.memory_reserved(self.device)
        else:
            # autograd's profiler, which torch.profiler.profile wraps: the wrapper's start asks
            # hasattr(torch, "_inductor"), which imports torch's compiler stack (1.4 s of CPU)
            self._profiler = torch.autograd.profiler.profile(use_cpu=True, use_kineto=True, profile_memory=True)
            # started without quiet.start_profiler's primer block: a block allocated before the
            # start and freed inside the profile moves what the meter measures by a few KiB
            with quiet_third_party():
                self._profiler.__enter__()
        return self

    def mark(self, name: str) -> None:
        """End the open phase (if any) here and begin phase ``name``."""
        if name in self._names:
            raise ValueError(f"phase {name!r} was already marked")
        self._names.append(name)
        if self.cuda:
            now = torch.cuda.memory_allocated(self.device)
            if self._open is not None:
                self._close_cuda(now)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._open = (name, now)
        else:
            with torch.profiler.record_function(MARK_PREFIX + name):
                pass

    def _close_cuda(self, now: int) -> None:
        name, start = self._open
        peak = max(torch.cuda.max_memory_allocated(self.device), start, now)
        self.record.phases.append(Phase(name, start, now, peak))
        self._reserved = max(self._reserved, torch.cuda.max_memory_reserved(self.device))

    def __exit__(self, *exc) -> None:
        if self.cuda:
            if self._open is not None:
                self._close_cuda(torch.cuda.memory_allocated(self.device))
            self.record.peak_reserved_bytes = self._reserved
            return
        with quiet_third_party():
            self._profiler.__exit__(*exc)
        if exc[0] is None:
            self.record.phases = replay_cpu_events(self._profiler, self._names, self.record.baseline_bytes)


def replay_cpu_events(prof, names: list[str], baseline: int) -> list[Phase]:
    """Turn the profiler's CPU memory events and the meter's markers into phases (``prof``: a
    stopped ``torch.autograd.profiler.profile`` that recorded with Kineto and ``profile_memory``;
    a ``torch.profiler.profile`` holds one as ``.profiler``).

    Events are sorted by time; a marker opens a phase; each allocation (positive bytes) or
    free (negative) moves the running total, whose maximum within a phase is its peak.
    """
    timeline: list[tuple[int, int, str | None]] = []  # (time ns, byte delta, marker name)
    for event in prof.kineto_results.events():
        event_name = readable(event.name)  # None: a Python frame's, whose code was freed (never ours)
        if event_name is None:
            continue
        if event_name == "[memory]":
            if event.device_type() == torch.autograd.DeviceType.CPU:
                timeline.append((event.start_ns(), event.nbytes(), None))
        elif event_name.startswith(MARK_PREFIX):
            timeline.append((event.start_ns(), 0, event_name[len(MARK_PREFIX):]))
    timeline.sort(key=lambda item: (item[0], item[2] is None))
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


def time_calls(fn: Callable[[], object], repeats: int, *, device: str | torch.device,
               before: Callable[[], None] = lambda: None) -> list[float]:
    """Step 3 of the protocol: milliseconds of each of ``repeats`` calls of ``fn``.

    CUDA events bracket each call (the wall clock on the CPU); ``before`` runs ahead of
    every call, outside the timed region (e.g. clearing ``.grad`` so that every call
    allocates its gradients as the measured step did).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}")
    device = torch.device(device)
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            before()
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = []
    for _ in range(repeats):
        before()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        events.append((start, stop))
    torch.cuda.synchronize(device)
    return [start.elapsed_time(stop) for start, stop in events]
