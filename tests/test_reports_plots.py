"""What each plot draws, read back from its Figure: the data of every line and marker, the
reference lines, the axes and the legend — not only that a PNG was written."""
from __future__ import annotations

import numpy as np
import pytest

from planted import MIB, cell, frame
from fusedce_profiler.instrument.snapshot import parse_timeline
from fusedce_reports import plots
from fusedce_reports.timeline import draw_timeline, plot_timeline
from test_profiler_snapshot import synthesise_snapshot

SIZES = (1024, 2048, 4096)
TORCH_MIB = {1024: 100, 2048: 200}  # torch runs out of memory at 4096
FUSED_MIB = {1024: 10, 2048: 12, 4096: 16}
COMPILE_MIB = {1024: 50, 2048: 90, 4096: 170}


def _grid_cells(vocab: int = 1000) -> list:
    """torch, fusedce and torch-compile at 1k, 2k, 4k tokens; torch out of memory at 4k; the
    floor (the gradients) grows with the tokens."""
    floor = {t: t / 1024 for t in SIZES}
    cells = [cell("torch", t, TORCH_MIB[t], time_ms=t / 100, floor_mib=floor[t], vocab=vocab) for t in TORCH_MIB]
    cells.append(cell("torch", 4096, None, status="oom", oom_mib=500, floor_mib=floor[4096], vocab=vocab))
    cells += [cell("fusedce", t, FUSED_MIB[t], time_ms=t / 200, floor_mib=floor[t], vocab=vocab) for t in SIZES]
    cells += [cell("torch-compile", t, COMPILE_MIB[t], time_ms=t / 400, spread=(t / 500, t / 300),
                   floor_mib=floor[t], vocab=vocab) for t in SIZES]
    return cells


@pytest.fixture(scope="module")
def grid():
    return frame(*_grid_cells())


def _by_gid(ax) -> dict:
    return {artist.get_gid(): artist for artist in ax.get_children() if artist.get_gid()}


def _legend_labels(fig) -> list[str]:
    (legend,) = fig.legends
    return [text.get_text() for text in legend.get_texts()]


def test_peak_memory_lines_hold_each_back_ends_peaks_and_the_oom_marker(grid):
    fig = plots.draw_peak_memory(grid)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    artists = _by_gid(ax)
    for name, peaks in (("torch", TORCH_MIB), ("fusedce", FUSED_MIB), ("torch-compile", COMPILE_MIB)):
        line = artists[f"backend:{name}"]
        assert list(line.get_xdata()) == sorted(peaks)
        assert list(line.get_ydata()) == [peaks[t] * MIB for t in sorted(peaks)]
    assert list(artists["oom:torch"].get_xdata()) == [4096]
    assert "oom:fusedce" not in artists and "oom:torch-compile" not in artists
    floor = artists["floor"]
    assert list(floor.get_xdata()) == list(SIZES)
    assert list(floor.get_ydata()) == [MIB, 2 * MIB, 4 * MIB]
    assert list(artists["logits"].get_ydata()) == [t * 1000 * 2 for t in SIZES]  # N·V bf16
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "tokens N = B·T" and ax.get_ylabel() == "peak extra (allocated)"
    assert ax.get_title() == "H=64 V=1000 · amp-bf16 · cuda"
    assert _legend_labels(fig) == ["torch", "torch-compile", "fusedce", "floor (gradients)",
                                   "one copy of the logits", "out of memory"]


def test_saving_lines_are_torchs_peak_minus_each_back_ends(grid):
    fig = plots.draw_saving(grid)
    ax = fig.axes[0]
    artists = _by_gid(ax)
    assert "backend:torch" not in artists  # the baseline saves nothing against itself
    fused = artists["backend:fusedce"]
    assert list(fused.get_xdata()) == [1024, 2048]  # no saving where torch ran out of memory
    assert list(fused.get_ydata()) == [90, 188]  # MiB
    assert list(artists["backend:torch-compile"].get_ydata()) == [50, 110]
    assert ax.get_xscale() == "linear" and ax.get_ylabel() == "saved (MiB)"
    assert _legend_labels(fig) == ["torch-compile", "fusedce"]


def test_saving_heatmap_holds_the_headline_back_ends_share_per_head_and_size(grid):
    other_head = [cell("torch", 1024, 400, vocab=4000), cell("fusedce", 1024, 40, vocab=4000)]
    both = frame(*_grid_cells(), *other_head)
    fig = plots.draw_saving_heatmap(both)
    image = _by_gid(fig.axes[0])["saving"]
    shares = np.ma.filled(image.get_array(), np.nan)
    # rows: V=1000 then V=4000; columns: 1k, 2k, 4k
    assert shares[0, 0] == pytest.approx(0.9) and shares[0, 1] == pytest.approx(188 / 200)
    assert np.isnan(shares[0, 2])  # torch ran out of memory: nothing to compare with
    assert shares[1, 0] == pytest.approx(0.9) and np.isnan(shares[1, 1])
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert "torch\noom" in labels and "not run" in labels
    assert plots.draw_saving_heatmap(grid) is None  # one vocabulary: no heatmap


def test_time_lines_hold_the_medians_and_error_bars_the_ranges(grid):
    fig = plots.draw_time(grid)
    ax = fig.axes[0]
    artists = _by_gid(ax)
    compiled = artists["backend:torch-compile"]
    assert list(compiled.get_xdata()) == list(SIZES)
    assert list(compiled.get_ydata()) == pytest.approx([t / 400 for t in SIZES])
    assert list(artists["backend:torch"].get_ydata()) == pytest.approx([10.24, 20.48])
    segments = [seg for c in ax.collections for seg in c.get_segments()]  # the min–max error bars
    assert any(np.allclose(seg, [[4096, 4096 / 500], [4096, 4096 / 300]]) for seg in segments)
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    assert _legend_labels(fig) == ["torch", "torch-compile", "fusedce"]


def test_parity_scatter_holds_every_cells_errors_and_the_tolerance():
    grid = frame(cell("torch", 1024, err=1e-3), cell("fusedce", 1024, err=2e-3), cell("fusedce", 2048, err=0.2))
    fig = plots.draw_parity(grid)
    ax = fig.axes[0]
    artists = _by_gid(ax)
    assert sorted(artists["fusedce:err_loss"].get_offsets()[:, 1]) == pytest.approx([2e-3, 0.2])
    assert list(artists["torch:err_grad_weight"].get_offsets()[:, 1]) == pytest.approx([1e-3])
    assert list(artists["tolerance"].get_ydata()) == pytest.approx([3e-2, 3e-2])
    assert ax.get_yscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["torch", "fusedce"]
    assert _legend_labels(fig) == ["loss", "grad hidden", "grad weight"]


def test_frontier_points_sit_at_peak_and_time_and_the_frontier_joins_the_pareto_set():
    grid = frame(*(cell(name, 4096, peak, time_ms=ms, err=err, floor_mib=8) for name, peak, ms, err in (
        ("torch", 100, 5.0, 1e-3), ("torch-compile", 50, 2.0, 1e-3), ("fusedce", 10, 3.0, 1e-3),
        ("liger", 12, 4.0, 1e-3),
        ("cce", 5, 1.0, 0.2))))  # cce: best on both counts, but failed parity
    fig = plots.draw_frontier(grid)
    ax = fig.axes[0]
    artists = _by_gid(ax)
    for name, peak, ms in (("torch", 100, 5.0), ("torch-compile", 50, 2.0), ("fusedce", 10, 3.0),
                           ("liger", 12, 4.0), ("cce", 5, 1.0)):
        point = artists[f"point:{name}"]
        assert list(point.get_xdata()) == [peak * MIB] and list(point.get_ydata()) == [ms]
    assert artists["point:cce"].get_markerfacecolor() == "none"  # failed parity: hollow
    assert artists["point:fusedce"].get_markerfacecolor() != "none"
    frontier = artists["frontier"]
    assert list(frontier.get_xdata()) == [10 * MIB, 50 * MIB]  # fusedce, torch-compile; not cce
    assert list(frontier.get_ydata()) == [3.0, 2.0]
    assert list(artists["floor"].get_xdata()) == [8 * MIB, 8 * MIB]
    assert "time-floor" not in artists
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "peak extra (allocated)" and ax.get_ylabel() == "time (median)"
    assert ax.get_title() == "H=64 V=1000 · amp-bf16 · cuda · 4k tokens"
    assert _legend_labels(fig) == ["torch", "torch-compile", "fusedce", "liger", "cce", "frontier (Pareto set)",
                                   "floor (gradients)", "failed parity (hollow)"]


def test_frontier_draws_a_time_floor_when_the_frame_has_one():
    grid = frame(cell("torch", 1024, 100, time_ms=5.0), cell("fusedce", 1024, 10, time_ms=3.0))
    grid["time_floor_ms"] = 0.5
    ax = plots.draw_frontier(grid).axes[0]
    assert list(_by_gid(ax)["time-floor"].get_ydata()) == [0.5, 0.5]


def test_frontier_has_a_panel_per_head_at_its_largest_size_when_there_are_many():
    cells = [cell(b, t, peak, time_ms=ms, vocab=v) for v in (1000, 2000, 4000) for t in (1024, 2048)
             for b, peak, ms in (("torch", 100, 2.0), ("fusedce", 10, 3.0))]
    fig = plots.draw_frontier(frame(*cells))
    titles = [a.get_title() for a in fig.axes if a.get_visible() and a.get_title()]
    assert titles == [f"H=64 V={v} · amp-bf16 · cuda · 2k tokens" for v in (1000, 2000, 4000)]


def test_frontier_has_a_panel_per_size_when_there_are_few(grid):
    fig = plots.draw_frontier(grid)
    titles = [a.get_title() for a in fig.axes if a.get_visible() and a.get_title()]
    assert titles == [f"H=64 V=1000 · amp-bf16 · cuda · {k} tokens" for k in ("1k", "2k", "4k")]


def test_plots_with_nothing_to_draw_write_nothing(tmp_path):
    empty = frame(cell("torch", 1024, None, status="oom"))
    for name in ("peak_memory", "saving", "time", "frontier", "parity"):
        assert getattr(plots, f"plot_{name}")(empty, tmp_path / f"{name}.png") is None
    assert list(tmp_path.iterdir()) == []


def test_a_back_end_named_with_dollar_signs_is_drawn_as_written(tmp_path):
    grid = frame(cell("torch", 1024, 100), cell("mine:$x$_$y$", 1024, 10))
    assert plots.plot_peak_memory(grid, tmp_path / "p.png").stat().st_size > 10_000
    fig = plots.draw_peak_memory(grid)
    assert r"mine:\$x\$_\$y\$" in _legend_labels(fig)


def test_timeline_draws_the_allocated_steps_the_backward_line_and_the_peak(tmp_path):
    timeline = parse_timeline(synthesise_snapshot())
    fig = draw_timeline(timeline, title="torch at 1k tokens")
    ax, side = fig.axes
    artists = _by_gid(ax)
    allocated = artists["allocated"]
    assert list(allocated.get_xdata()) == timeline.times_ms
    assert list(allocated.get_ydata()) == pytest.approx([b / MIB for b in timeline.allocated_bytes])
    assert allocated.get_drawstyle() == "steps-post"
    assert list(artists["backward"].get_xdata()) == [timeline.backward_ms] * 2
    peak = artists["peak"]
    assert list(peak.get_xdata()) == [timeline.peak_ms] and list(peak.get_ydata()) == [timeline.peak_bytes / MIB]
    assert max(allocated.get_ydata()) == pytest.approx(timeline.peak_bytes / MIB)
    assert ax.get_xlabel() == "time since start of step (ms)" and ax.get_ylabel() == "allocated over baseline (MiB)"
    assert ax.get_title() == "torch at 1k tokens"
    listing = _by_gid(side)["live-at-peak"].get_text().splitlines()
    assert listing[0] == "largest tensors alive at the peak:"
    assert len(listing) == 1 + len(timeline.live_at_peak)
    assert plot_timeline(timeline, tmp_path / "t.png").stat().st_size > 10_000
