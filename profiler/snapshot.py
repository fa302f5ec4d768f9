"""CUDA memory snapshots of the measured step, and their parsing into a timeline.

Recording (:class:`SnapshotRecorder`, CUDA only) wraps the measured step in
``torch.cuda.memory._record_memory_history`` and saves ``torch.cuda.memory._snapshot()``
as a gzip-compressed pickle (``<stem>.pickle.gz``: gunzip it to open in PyTorch's
memory_viz page) plus an offline PNG timeline (:mod:`profiler.timeline_plot`).

The forward/backward boundary is marked inside the trace itself: just before backward
the recorder allocates and frees a small tensor from :func:`fusedce_profile_phase_marker`,
and the parser finds that function's name in the allocation's stack frames. So the
boundary needs no clock and survives in the stored file.

Parsing (:func:`load_snapshot`, :func:`parse_timeline`) is a pure function of the
stored snapshot, so ``report DIR`` can rebuild every plot without a GPU. The format is
the one ``torch.cuda.memory._snapshot()`` documents: ``{"segments": [...],
"device_traces": [[entry, ...] per device]}``, each entry a dict with ``action``
("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
"snapshot"), ``addr``, ``size`` (bytes), ``frames`` (``[{"filename", "line", "name"}]``,
innermost first) and ``time_us``.

Public API: :class:`SnapshotRecorder`, :func:`load_snapshot`, :func:`parse_timeline`,
:class:`Timeline`, :class:`LiveBlock`, :data:`MARKER_FUNCTION`.
"""
from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass, field
from pathlib import Path

MARKER_FUNCTION = "fusedce_profile_phase_marker"
_MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class LiveBlock:
    """One allocation alive at the peak: ``size`` bytes, allocated at ``frame``
    (``file:line:function`` of the innermost Python frame outside torch, or the
    innermost frame), ``op``: the innermost torch Python frame (e.g. ``cross_entropy``)."""

    size: int
    frame: str
    op: str = ""


@dataclass
class Timeline:
    """Allocated bytes over the recorded step, relative to its start.

    ``times_ms[i]`` / ``allocated_bytes[i]``: after trace entry i (time since the first
    entry; entry index when the trace has no ``time_us``). ``backward_ms``: where backward
    started (``None`` if unmarked). ``peak_bytes`` at ``peak_ms``; ``live_at_peak``: the
    largest allocations alive then, largest first.
    """

    times_ms: list[float] = field(default_factory=list)
    allocated_bytes: list[int] = field(default_factory=list)
    backward_ms: float | None = None
    peak_bytes: int = 0
    peak_ms: float = 0.0
    live_at_peak: list[LiveBlock] = field(default_factory=list)


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

        # Python stacks only: symbolising C++ frames at snapshot time takes minutes.
        torch.cuda.memory._record_memory_history(max_entries=_MAX_ENTRIES, stacks="python")

    def mark_backward(self) -> None:
        fusedce_profile_phase_marker(self.device)

    def save(self, stem: Path, title: str = "") -> tuple[str, str | None]:
        """Stop recording; write ``stem.pickle.gz`` and ``stem.png``; return both paths."""
        import torch

        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        stem.parent.mkdir(parents=True, exist_ok=True)
        pickle_path = stem.with_name(stem.name + ".pickle.gz")
        with gzip.open(pickle_path, "wb") as fh:
            pickle.dump(snapshot, fh)
        from profiler.timeline_plot import plot_timeline

        png = stem.with_name(stem.name + ".png")
        plot_timeline(parse_timeline(snapshot), png, title=title)
        return str(pickle_path), str(png)


def load_snapshot(path: str | Path) -> dict:
    """Read a snapshot saved by :class:`SnapshotRecorder` (gzip) or a plain pickle."""
    path = Path(path)
    with path.open("rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as fh:
        return pickle.load(fh)


def _short(frame: dict) -> str:
    return f"{Path(frame.get('filename', '?')).name}:{frame.get('line', 0)}:{frame.get('name', '?')}"


def _is_torch(filename: str) -> bool:
    return "/torch/" in filename or filename.startswith("torch/")


def _describe(frames: list[dict]) -> tuple[str, str]:
    """(innermost Python frame outside torch, innermost torch Python frame)."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    outside = next((f for f in python if not _is_torch(f["filename"])), None)
    inside = next((f for f in python if _is_torch(f["filename"])), None)
    where = outside or (python[0] if python else (frames[0] if frames else None))
    return (_short(where) if where else "?"), (inside.get("name", "") if inside else "")


def _pick_device(snapshot: dict) -> int:
    traces = snapshot.get("device_traces") or []
    if not traces:
        raise ValueError("snapshot has no device_traces: was _record_memory_history enabled?")
    return max(range(len(traces)), key=lambda i: len(traces[i]))


def parse_timeline(snapshot: dict, *, device: int | None = None, top: int = 8) -> Timeline:
    """Allocated bytes over time, backward boundary, and the peak's largest live blocks.

    Pure function of ``snapshot`` (a ``torch.cuda.memory._snapshot()`` dict). Frees are
    counted at ``free_completed`` (when the allocator's allocated counter drops), or at
    ``free_requested`` in traces that have no completions. Blocks allocated before the
    recording started and freed during it are counted from 0 down (their size is known).
    """
    trace = snapshot["device_traces"][_pick_device(snapshot) if device is None else device]
    free_action = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    t0 = next((e["time_us"] for e in trace if "time_us" in e), None)
    timeline = Timeline()
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
        timeline.times_ms.append(when)
        timeline.allocated_bytes.append(current)
        if current > timeline.peak_bytes:
            timeline.peak_bytes, timeline.peak_ms = current, when
            live_at_peak = dict(live)
    largest = sorted(live_at_peak.values(), key=lambda e: e["size"], reverse=True)[:top]
    timeline.live_at_peak = [LiveBlock(e["size"], *_describe(e.get("frames", []))) for e in largest]
    return timeline
