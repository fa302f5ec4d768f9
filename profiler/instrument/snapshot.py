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

A stored timeline is bounded twice: when it is written and again when it is read
(:meth:`Timeline.from_dict`), since a folder may come from someone else. The series keeps at most
:data:`MAX_TIMELINE_POINTS` points (:func:`thinned_indices`) and the blocks alive at the peak at
most :data:`LISTED_BLOCKS` (:func:`largest_first`); what was left out is counted in the timeline.

Public API: :class:`SnapshotRecorder`, :func:`parse_timeline`, :class:`Timeline`,
:class:`LiveBlock`, :func:`thinned_indices`, :func:`largest_first`, :data:`MARKER_FUNCTION`,
:data:`MAX_TIMELINE_POINTS`, :data:`LISTED_BLOCKS`.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusedce_profiler.instrument import fields, store

MARKER_FUNCTION = "fusedce_profile_phase_marker"
_MAX_ENTRIES = 1_000_000
MAX_TIMELINE_POINTS = 20_000
"""The most points of a timeline's series, written or read (a plot is ~1,000 pixels wide)."""
PEAK_NEIGHBOURS = 100
"""Points on each side of the peak that thinning keeps exactly (at most an eighth of the limit)."""
LISTED_BLOCKS = 8
"""The most blocks alive at the peak a timeline lists; the others are counted, not listed."""
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
    points (a longer series is thinned: :func:`thinned_indices`); ``thinned_from``: how many
    points it had then (0: none left out). ``backward_ms``: where backward started (``None`` if
    unmarked). ``peak_bytes`` at ``peak_ms``; ``live_at_peak``: the largest allocations alive
    then, largest first, at most :data:`LISTED_BLOCKS`; ``unlisted_blocks`` more were alive,
    holding ``unlisted_bytes``.
    """

    times_ms: list[float] = field(default_factory=list)
    allocated_bytes: list[int] = field(default_factory=list)
    backward_ms: float | None = None
    peak_bytes: int = 0
    peak_ms: float = 0.0
    live_at_peak: list[LiveBlock] = field(default_factory=list)
    thinned_from: int = 0
    unlisted_blocks: int = 0
    unlisted_bytes: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Timeline":
        """Validate a stored timeline (``ValueError`` naming the bad field), thinned to
        :data:`MAX_TIMELINE_POINTS` points and :data:`LISTED_BLOCKS` listed blocks whatever the
        file holds: its cost grows linearly with the file, which its size limit bounds."""
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        times, allocated = raw.get("times_ms", []), raw.get("allocated_bytes", [])
        if not (isinstance(times, list) and isinstance(allocated, list) and len(times) == len(allocated)):
            raise ValueError("times_ms and allocated_bytes must be lists of equal length")
        live = raw.get("live_at_peak", [])
        if not isinstance(live, list) or not all(isinstance(block, dict) for block in live):
            raise ValueError("live_at_peak must be a list of objects")
        sizes = [fields.int_field(block.get("size"), "live_at_peak.size", optional=False) for block in live]
        listed, unlisted, unlisted_bytes = largest_first(sizes, LISTED_BLOCKS)
        blocks = [_stored_block(live[i], sizes[i]) for i in listed]
        seconds = _series(times, "times_ms", np.float64)
        values = _series(allocated, "allocated_bytes", np.int64)
        keep = thinned_indices(values, MAX_TIMELINE_POINTS)
        stored_from = fields.int_field(raw.get("thinned_from", 0), "thinned_from", optional=False, minimum=0)
        thinned_from = max(stored_from, len(values)) if len(keep) < len(values) else \
            (stored_from if stored_from > len(values) else 0)  # a count below the points it has says nothing
        return cls(seconds[keep].tolist(), values[keep].tolist(),
                   fields.float_field(raw.get("backward_ms"), "backward_ms"),
                   fields.int_field(raw.get("peak_bytes", 0), "peak_bytes", optional=False),
                   fields.float_field(raw.get("peak_ms", 0.0), "peak_ms", optional=False), blocks, thinned_from,
                   unlisted + fields.int_field(raw.get("unlisted_blocks", 0), "unlisted_blocks", optional=False,
                                              minimum=0),
                   unlisted_bytes + fields.int_field(raw.get("unlisted_bytes", 0), "unlisted_bytes",
                                                    optional=False, minimum=0))


def _stored_block(block: dict, size: int) -> LiveBlock:
    """A stored live block, its stack cut to :data:`STACK_DEPTH` frames."""
    stack = block.get("stack", ())
    if not isinstance(stack, list | tuple):
        raise ValueError("live_at_peak.stack must be a list")
    return LiveBlock(size, str(block.get("frame", "?")), str(block.get("op", "")),
                     tuple(str(frame) for frame in stack[:STACK_DEPTH]))


def _series(values: list, name: str, dtype: type) -> np.ndarray:
    """A stored series as an array, every element checked as :func:`fields.float_field` (``dtype``
    float64) or :func:`fields.int_field` (int64) checks it; plain numbers are checked at once."""
    plain = {int} if dtype is np.int64 else {int, float}
    if set(map(type, values)) <= plain:
        try:
            return np.asarray(values, dtype=dtype)
        except OverflowError:  # an integer past 64 bits: named below
            pass
    check = fields.int_field if dtype is np.int64 else fields.float_field
    return np.asarray([check(value, name, optional=False) for value in values], dtype=dtype)


def thinned_indices(values: np.ndarray, limit: int) -> np.ndarray:
    """Sorted indices of at most ``limit`` points of the series ``values`` (1-D) that draw it
    faithfully: all of them when there are no more; else the peak (the first highest point) and
    up to :data:`PEAK_NEIGHBOURS` points on each side of it exactly, and of every stretch of
    consecutive points its lowest and highest (a step line drawn through them reaches every
    high and low the series reaches, at a resolution of one stretch). O(n) in time and memory."""
    n = len(values)
    if n <= limit:
        return np.arange(n)
    peak = int(np.argmax(values))
    reach = min(PEAK_NEIGHBOURS, limit // 8)
    window = np.arange(max(0, peak - reach), min(n, peak + reach + 1))
    stretches = max(1, (limit - len(window)) // 2)
    width = -(-n // stretches)
    padded = np.pad(values, (0, stretches * width - n), mode="edge").reshape(stretches, width)
    starts = np.arange(stretches) * width
    lows = np.minimum(starts + padded.argmin(axis=1), n - 1)  # a padded point is the last one again
    highs = np.minimum(starts + padded.argmax(axis=1), n - 1)
    return np.unique(np.concatenate([window, lows, highs]))


def largest_first(sizes: Sequence[int], listed: int) -> tuple[list[int], int, int]:
    """(indices of the ``listed`` largest of ``sizes``, largest first, ties in their order; how
    many others there are; their sum). O(n log listed), never a sort of all of them."""
    top = heapq.nlargest(listed, range(len(sizes)), key=sizes.__getitem__)
    return top, len(sizes) - len(top), sum(sizes) - sum(sizes[i] for i in top)


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


def parse_timeline(snapshot: dict, *, device: int | None = None, top: int = LISTED_BLOCKS) -> Timeline:
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
    keep = thinned_indices(np.asarray(allocated, dtype=np.int64), MAX_TIMELINE_POINTS)
    timeline.times_ms = [times[i] for i in keep]
    timeline.allocated_bytes = [allocated[i] for i in keep]
    timeline.thinned_from = len(times) if len(keep) < len(times) else 0
    alive = list(live_at_peak.values())
    listed, timeline.unlisted_blocks, timeline.unlisted_bytes = largest_first([e["size"] for e in alive], top)
    timeline.live_at_peak = [LiveBlock(alive[i]["size"], *_describe(alive[i].get("frames", []))) for i in listed]
    return timeline
