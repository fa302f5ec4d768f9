"""Snapshot parsing, the stored timeline and its offline plot, on a synthetic snapshot.

:func:`synthesise_snapshot` returns the trace of eager ``F.cross_entropy(F.linear(h, W), y)``
under CUDA amp-bf16 at N=1024, H=768, V=32777, in the format ``torch.cuda.memory._snapshot()``
produces, with our backward marker.
"""
from __future__ import annotations

import json

import pytest

from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.snapshot import MARKER_FUNCTION, Timeline, parse_timeline
from fusedce_reports.timeline import plot_timeline

N, H, V = 1024, 768, 32777
USER = {"filename": "/home/user/project/train.py", "line": 42, "name": "training_step"}
LINEAR = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 2380, "name": "linear"}
XENT = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 3462, "name": "cross_entropy"}
BACKWARD = {"filename": "/venv/lib/python3.11/site-packages/torch/_tensor.py", "line": 647, "name": "backward"}
MARKER = {"filename": "/repo/profiler/snapshot.py", "line": 70, "name": MARKER_FUNCTION}
CPP = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}


def _round(size: int) -> int:
    return -(-size // 512) * 512  # the caching allocator's block rounding


def synthesise_snapshot() -> dict:
    """A plausible trace: (action, name, bytes, frames) in order, 10 µs apart."""
    nv = N * V
    steps = [
        ("alloc", "W_bf16", V * H * 2, [CPP, LINEAR, USER]),
        ("alloc", "logits", nv * 2, [CPP, LINEAR, USER]),
        ("alloc", "logp", nv * 2, [CPP, XENT, USER]),
        ("alloc", "logp_fp32", nv * 4, [CPP, XENT, USER]),
        ("alloc", "loss", 4, [CPP, XENT, USER]),
        ("free", "logits", None, None),
        ("alloc", "marker", 1, [CPP, MARKER]),
        ("free", "marker", None, None),
        ("alloc", "d_logp_fp32", nv * 4, [CPP, BACKWARD, USER]),
        ("free", "logp_fp32", None, None),
        ("alloc", "d_logp", nv * 2, [CPP, BACKWARD, USER]),
        ("free", "d_logp_fp32", None, None),
        ("alloc", "d_logits", nv * 2, [CPP, BACKWARD, USER]),
        ("free", "logp", None, None),
        ("free", "d_logp", None, None),
        ("alloc", "grad_h", N * H * 2, [CPP, BACKWARD, USER]),
        ("alloc", "grad_W_bf16", V * H * 2, [CPP, BACKWARD, USER]),
        ("free", "d_logits", None, None),
        ("free", "W_bf16", None, None),
        ("alloc", "grad_W", V * H * 4, [CPP, BACKWARD, USER]),
        ("free", "grad_W_bf16", None, None),
    ]
    live: dict[str, tuple[int, int, list]] = {}
    trace, addr, t = [], 0x7F0000000000, 1_700_000_000_000_000
    for action, name, size, frames in steps:
        t += 10
        if action == "alloc":
            addr += 1 << 34
            live[name] = (addr, _round(size), frames)
            trace.append({"action": "alloc", "addr": addr, "size": _round(size), "stream": 0,
                          "frames": frames, "time_us": t})
        else:
            a, s, f = live.pop(name)
            for kind in ("free_requested", "free_completed"):
                trace.append({"action": kind, "addr": a, "size": s, "stream": 0, "frames": f, "time_us": t})
    segments = [{"device": 0, "address": a, "total_size": s, "stream": 0, "segment_type": "large",
                 "allocated_size": s, "active_size": s, "requested_size": s,
                 "blocks": [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
                             "frames": f}]}
                for a, s, f in live.values()]
    return {"segments": segments, "device_traces": [trace]}


def test_timeline_peak_is_the_nll_backward_step():
    timeline = parse_timeline(synthesise_snapshot())
    nv = N * V
    # at d_logp_fp32: W_bf16 + logp (bf16) + logp_fp32 + loss + d_logp_fp32
    expected = _round(V * H * 2) + _round(nv * 2) + 2 * _round(nv * 4) + _round(4)
    assert timeline.peak_bytes == expected
    assert timeline.backward_ms is not None and timeline.backward_ms < timeline.peak_ms
    sizes = [block.size for block in timeline.live_at_peak]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[:2] == [_round(nv * 4)] * 2
    assert timeline.live_at_peak[0].frame == "train.py:42:training_step"
    assert {block.op for block in timeline.live_at_peak[:3]} == {"cross_entropy", "backward"}
    assert timeline.live_at_peak[0].stack[-1] == "train.py:42:training_step"  # the stack, innermost first


def test_timeline_round_trips_through_strict_json(tmp_path):
    timeline = parse_timeline(synthesise_snapshot())
    path = store.write_json(tmp_path / "cell.timeline.json", timeline.to_dict())
    assert Timeline.from_dict(json.loads(path.read_text())) == timeline


def test_a_long_trace_keeps_its_peak_when_thinned(monkeypatch):
    import fusedce_profiler.instrument.snapshot as snapshot_module

    full = parse_timeline(synthesise_snapshot())
    monkeypatch.setattr(snapshot_module, "MAX_TIMELINE_POINTS", 5)
    thinned = snapshot_module.parse_timeline(synthesise_snapshot())
    assert len(thinned.times_ms) <= 5 and max(thinned.allocated_bytes) == full.peak_bytes


def test_timeline_ends_with_only_the_gradients_alive():
    timeline = parse_timeline(synthesise_snapshot())
    assert timeline.allocated_bytes[-1] == _round(4) + _round(N * H * 2) + _round(V * H * 4)
    assert timeline.times_ms == sorted(timeline.times_ms)


def test_timeline_without_marker_or_times_falls_back_to_entry_order():
    snapshot = synthesise_snapshot()
    trace = [dict(e) for e in snapshot["device_traces"][0]
             if MARKER_FUNCTION not in {f["name"] for f in e["frames"]}]
    for entry in trace:
        del entry["time_us"]
    timeline = parse_timeline({"segments": [], "device_traces": [trace]})
    assert timeline.backward_ms is None
    assert all(t.is_integer() for t in timeline.times_ms)  # entry indices
    assert timeline.times_ms == sorted(set(timeline.times_ms))
    assert timeline.peak_bytes == parse_timeline(snapshot).peak_bytes


def test_snapshot_without_traces_is_a_clear_error():
    with pytest.raises(ValueError, match="device_traces"):
        parse_timeline({"segments": [], "device_traces": []})


def test_timeline_plot_writes_a_png(tmp_path):
    path = plot_timeline(parse_timeline(synthesise_snapshot()), tmp_path / "timeline.png", title="torch amp-bf16")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a drawn figure, not an empty canvas
