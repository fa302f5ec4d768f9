"""The time–memory frontier and when one time is faster than another."""
from __future__ import annotations

from planted import MIB, cell, frame
from fusedce_reports.frontier import frontier_at, frontiers, largest_frontier
from fusedce_reports.timing import Timing, faster


def _frontier(*cells):
    return frontier_at(frame(*cells))


def _on(frontier):
    return [p.backend for p in frontier.pareto]


def test_the_frontier_is_the_back_ends_no_other_beats_on_both_memory_and_time():
    f = _frontier(cell("torch", 1024, 100, time_ms=5.0), cell("torch-compile", 1024, 50, time_ms=2.0),
                  cell("fusedce", 1024, 10, time_ms=3.0), cell("liger", 1024, 12, time_ms=4.0))
    assert _on(f) == ["fusedce", "torch-compile"]  # from the lowest memory up
    dominated = {p.backend: p.dominated_by for p in f.points}
    assert dominated == {"torch": ("torch-compile", "fusedce", "liger"), "torch-compile": (), "fusedce": (),
                         "liger": ("fusedce",)}
    assert f.tokens == 1024 and f.head == "64×1000" and f.floor_bytes == MIB


def test_equal_on_one_count_and_better_on_the_other_dominates_and_exact_ties_do_not():
    f = _frontier(cell("torch", 1024, 10, time_ms=3.0), cell("fusedce", 1024, 10, time_ms=2.0),
                  cell("liger", 1024, 10, time_ms=2.0))
    assert _on(f) == ["fusedce", "liger"]


def test_a_back_end_that_failed_parity_is_neither_on_the_frontier_nor_pushes_others_off_it():
    f = _frontier(cell("fusedce", 1024, 10, time_ms=3.0), cell("cce", 1024, 5, time_ms=1.0, err=0.2))
    cce = next(p for p in f.points if p.backend == "cce")
    assert cce.parity_failed and not cce.on_frontier
    assert _on(f) == ["fusedce"]


def test_on_the_cpu_a_time_inside_the_others_range_is_not_faster():
    # torch-compile's median is lower, but the ranges overlap: fusedce, with less memory, dominates it.
    f = _frontier(cell("fusedce", 1024, 10, time_ms=3.0, spread=(2.0, 4.0), cpu=True),
                  cell("torch-compile", 1024, 50, time_ms=2.5, spread=(2.0, 3.0), cpu=True))
    assert f.noisy and _on(f) == ["fusedce"]
    f = _frontier(cell("fusedce", 1024, 10, time_ms=3.0, spread=(2.8, 3.2), cpu=True),
                  cell("torch-compile", 1024, 50, time_ms=1.0, spread=(0.9, 1.1), cpu=True))
    assert _on(f) == ["fusedce", "torch-compile"]


def test_faster_compares_medians_on_a_gpu_and_ranges_on_the_cpu():
    gpu = Timing(1.0, 0.5, 3.0, noisy=False), Timing(2.0, 1.5, 2.5, noisy=False)
    assert faster(*gpu) and not faster(gpu[1], gpu[0])
    cpu = Timing(1.0, 0.5, 1.6, noisy=True), Timing(2.0, 1.5, 2.5, noisy=True)
    assert not faster(*cpu) and not faster(cpu[1], cpu[0])
    assert faster(Timing(1.0, 0.5, 1.4, noisy=True), cpu[1])
    assert not faster(Timing(1.0, None, None, noisy=True), cpu[1])


def test_the_largest_frontier_is_at_the_largest_size_where_two_back_ends_ran():
    grid = frame(cell("torch", 1024, 60), cell("fusedce", 1024, 6), cell("torch", 8192, None, status="oom"),
                 cell("fusedce", 8192, 48))
    assert largest_frontier(grid).tokens == 1024
    assert frontier_at(grid[grid["tokens"] == 8192]).out_of_memory == ("torch",)


def test_frontiers_give_every_size_when_few_and_the_largest_per_head_when_many():
    few = frame(cell("torch", 1024, 60), cell("fusedce", 1024, 6), cell("torch", 2048, 120), cell("fusedce", 2048, 8))
    assert [f.tokens for f in frontiers(few)] == [1024, 2048]
    many = frame(*(cell(b, t, 10, vocab=v) for v in (1000, 2000, 3000) for t in (1024, 2048)
                   for b in ("torch", "fusedce")))
    assert [(f.head, f.tokens) for f in frontiers(many)] == [("64×1000", 2048), ("64×2000", 2048), ("64×3000", 2048)]


def test_every_size_gives_a_frontier_for_each_head_and_size_however_many():
    many = frame(*(cell(b, t, 10, vocab=v) for v in (1000, 2000, 3000) for t in (1024, 2048)
                   for b in ("torch", "fusedce")))
    assert [(f.head, f.tokens) for f in frontiers(many, every_size=True)] == [
        (f"64×{v}", t) for v in (1000, 2000, 3000) for t in (1024, 2048)]
