"""CUDA allocator snapshots of a measured step, and the timeline the report draws from them.

Recording (:class:`SnapshotRecorder`, CUDA only) wraps the measured step in
``torch.cuda.memory._record_memory_history`` and, at the end, writes two files:

- ``<stem>.pickle``: ``torch.cuda.memory._snapshot()`` pickled, exactly what
  ``torch.cuda.memory._dump_snapshot`` writes and PyTorch's memory viewer
  (https://pytorch.org/memory_viz) opens. It is a pickle: this tool writes it for the user
  and never reads it back.
- ``<stem>.timeline.json``: :func:`parse_timeline`'s :class:`Timeline` as plain JSON — the
  allocated bytes over time, the forward/backward boundary, the peak and the largest
  allocations alive at the peak with their stacks. The report draws from this file alone.

The forward/backward boundary is marked inside the trace itself: just before backward the
recorder allocates and frees a small tensor from :func:`fusedce_profile_phase_marker`, and
the parser finds that function's name in the allocation's stack frames.

The snapshot format is the one ``torch.cuda.memory._snapshot()`` documents:
``{"segments": [...], "device_traces": [[entry, ...] per device]}``, each entry a dict with
``action`` ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
"oom", "snapshot"), ``addr``, ``size`` (bytes), ``frames`` (``[{"filename", "line", "name"}]``,
innermost first) and ``time_us``.

Public API: :class:`SnapshotRecorder`, :func:`parse_timeline`, :class:`Timeline`,
:class:`LiveBlock`, :data:`MARKER_FUNCTION`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from fusedce_profiler.instrument import store

MARKER_FUNCTION = "fusedce_profile_phase_marker"
_MAX_ENTRIES = 1_000_000
MAX_TIMELINE_POINTS = 20_000
STACK_DEPTH = 16


@dataclass(frozen=True)
class LiveBlock:
    """One allocation alive at the peak: ``size`` bytes, allocated at ``frame``
    (``file:line:function`` of the innermost Python frame outside torch, or the innermost
    frame), ``op``: the innermost torch Python frame (e.g. ``cross_entropy``); ``stack``: the
    allocation's Python frames, innermost first (at most :data:`STACK_DEPTH`)."""

    size: int
    frame: str
    op: str = ""
    stack: tuple[str, ...] = ()


@dataclass
class Timeline:
    """Allocated bytes over the recorded step, relative to its start.

    ``times_ms[i]`` / ``allocated_bytes[i]``: after trace entry i (time since the first entry;
    entry index when the trace has no ``time_us``), at most :data:`MAX_TIMELINE_POINTS`
    points (longer traces keep each bucket's highest point). ``backward_ms``: where backward
    started (``None`` if unmarked). ``peak_bytes`` at ``peak_ms``; ``live_at_peak``: the
    largest allocations alive then, largest first.
    """

    times_ms: list[float] = field(default_factory=list)
    allocated_bytes: list[int] = field(default_factory=list)
    backward_ms: float | None = None
    peak_bytes: int = 0
    peak_ms: float = 0.0
    live_at_peak: list[LiveBlock] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Timeline":
        """Validate a stored timeline (``ValueError`` naming the bad field)."""
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        times, allocated = raw.get("times_ms", []), raw.get("allocated_bytes", [])
        if not (isinstance(times, list) and isinstance(allocated, list) and len(times) == len(allocated)):
            raise ValueError("times_ms and allocated_bytes must be lists of equal length")
        blocks = []
        live = raw.get("live_at_peak", [])
        if not isinstance(live, list) or not all(isinstance(block, dict) for block in live):
            raise ValueError("live_at_peak must be a list of objects")
        for block in live:
            stack = block.get("stack", ())
            if not isinstance(stack, list | tuple):
                raise ValueError("live_at_peak.stack must be a list")
            blocks.append(LiveBlock(store.int_field(block.get("size"), "live_at_peak.size", optional=False),
                                    str(block.get("frame", "?")), str(block.get("op", "")),
                                    tuple(str(f) for f in stack)))
        return cls([store.float_field(t, "times_ms", optional=False) for t in times],
                   [store.int_field(b, "allocated_bytes", optional=False) for b in allocated],
                   store.float_field(raw.get("backward_ms"), "backward_ms"),
                   store.int_field(raw.get("peak_bytes", 0), "peak_bytes", optional=False),
                   store.float_field(raw.get("peak_ms", 0.0), "peak_ms", optional=False), blocks)


def fusedce_profile_phase_marker(device) -> None:
    """Allocate and free one small block: the backward-start marker in the trace."""
    import torch

    marker = torch.empty(1, dtype=torch.uint8, device=device)
    del marker


class SnapshotRecorder:
    """``start()`` before forward, ``mark_backward()`` before backward, ``save(stem)`` after."""

    def __init__(self, device) -> None:
        self.device = device

    def start(self) -> None:
        import torch

        from fusedce_profiler.instrument.tracing.quiet import quiet_third_party

        # Python stacks only: symbolising C++ frames at snapshot time takes minutes.
        with quiet_third_party():
            torch.cuda.memory._record_memory_history(max_entries=_MAX_ENTRIES, stacks="python")

    def mark_backward(self) -> None:
        fusedce_profile_phase_marker(self.device)

    def save(self, stem: Path) -> tuple[Path, Path]:
        """Stop recording; write ``stem.pickle`` and ``stem.timeline.json``; return both paths."""
        import torch

        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        pickle_path = stem.with_name(stem.name + store.SNAPSHOT_SUFFIX)
        timeline_path = stem.with_name(stem.name + store.TIMELINE_SUFFIX)
        store.write_pickle(pickle_path, snapshot)
        store.write_json(timeline_path, parse_timeline(snapshot).to_dict())
        return pickle_path, timeline_path


def _short(frame: dict) -> str:
    return f"{Path(str(frame.get('filename', '?'))).name}:{frame.get('line', 0)}:{frame.get('name', '?')}"


def _is_torch(filename: str) -> bool:
    return "/torch/" in filename or filename.startswith("torch/")


def _describe(frames: list[dict]) -> tuple[str, str, tuple[str, ...]]:
    """(innermost Python frame outside torch, innermost torch Python frame, the stack)."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    outside = next((f for f in python if not _is_torch(f["filename"])), None)
    inside = next((f for f in python if _is_torch(f["filename"])), None)
    where = outside or (python[0] if python else (frames[0] if frames else None))
    stack = tuple(_short(f) for f in python[:STACK_DEPTH])
    return (_short(where) if where else "?"), (str(inside.get("name", "")) if inside else ""), stack


def _pick_device(snapshot: dict) -> int:
    traces = snapshot.get("device_traces") or []
    if not traces:
        raise ValueError("snapshot has no device_traces: was _record_memory_history enabled?")
    return max(range(len(traces)), key=lambda i: len(traces[i]))


def _thin(times: list[float], values: list[int], limit: int) -> tuple[list[float], list[int]]:
    """At most ``limit`` points: each bucket of consecutive points keeps its highest one."""
    if len(times) <= limit:
        return times, values
    step = -(-len(times) // limit)
    kept_t, kept_v = [], []
    for start in range(0, len(times), step):
        bucket = range(start, min(start + step, len(times)))
        best = max(bucket, key=lambda i: values[i])
        kept_t.append(times[best])
        kept_v.append(values[best])
    return kept_t, kept_v


def parse_timeline(snapshot: dict, *, device: int | None = None, top: int = 8) -> Timeline:
    """Allocated bytes over time, backward boundary, and the peak's largest live blocks.

    A pure function of ``snapshot`` (a ``torch.cuda.memory._snapshot()`` dict). Frees are
    counted at ``free_completed`` (when the allocator's allocated counter drops), or at
    ``free_requested`` in traces that have no completions. Blocks allocated before the
    recording started and freed during it are counted from 0 down (their size is known).
    """
    trace = snapshot["device_traces"][_pick_device(snapshot) if device is None else device]
    free_action = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    t0 = next((e["time_us"] for e in trace if "time_us" in e), None)
    timeline = Timeline()
    times: list[float] = []
    allocated: list[int] = []
    live: dict[int, dict] = {}
    live_at_peak: dict[int, dict] = {}
    current = 0
    for index, entry in enumerate(trace):
        action = entry["action"]
        when = (entry["time_us"] - t0) / 1e3 if t0 is not None and "time_us" in entry else float(index)
        if action == "alloc":
            names = {f.get("name") for f in entry.get("frames", [])}
            if MARKER_FUNCTION in names and timeline.backward_ms is None:
                timeline.backward_ms = when
            current += entry["size"]
            live[entry["addr"]] = entry
        elif action == free_action:
            current -= entry["size"]
            live.pop(entry["addr"], None)
        else:
            continue
        times.append(when)
        allocated.append(current)
        if current > timeline.peak_bytes:
            timeline.peak_bytes, timeline.peak_ms = current, when
            live_at_peak = dict(live)
    timeline.times_ms, timeline.allocated_bytes = _thin(times, allocated, MAX_TIMELINE_POINTS)
    largest = sorted(live_at_peak.values(), key=lambda e: e["size"], reverse=True)[:top]
    timeline.live_at_peak = [LiveBlock(e["size"], *_describe(e.get("frames", []))) for e in largest]
    return timeline
