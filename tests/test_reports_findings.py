"""Findings and parity verdicts computed from small hand-made result sets."""
import math

import pytest

from fusedce_profiler.instrument.records import CellResult, CellSpec, Parity
from fusedce_profiler.instrument.tolerances import parity_verdict, tolerance_for
from fusedce_reports import compute_findings, results_frame
from fusedce_reports.tables import cell_tables

MIB = 1 << 20


def _cell(backend, tokens, peak_mib, *, status="ok", time_ms=1.0, err=1e-3, vocab=1000, hidden=64, mode="amp-bf16"):
    spec = CellSpec(backend, tokens, vocab, hidden, mode=mode)
    return CellResult(spec, status=status, peak_step_bytes=None if peak_mib is None else int(peak_mib * MIB),
                      floor_bytes=int(MIB), time_ms=time_ms if status == "ok" else None,
                      parity=Parity(loss=err, grad_hidden=err, grad_weight=err) if status == "ok" else Parity())


def _texts(results):
    return [f.text for f in compute_findings(results_frame(results))]


def test_saving_is_measured_against_torch_at_the_same_shape():
    frame = results_frame([_cell("torch", 1024, 100), _cell("fusedce", 1024, 10),
                           _cell("torch", 2048, 200), _cell("fusedce", 2048, 12)])
    fused = frame[frame["backend"] == "fusedce"].set_index("tokens")
    assert fused.loc[1024, "saving_bytes"] == 90 * MIB
    assert fused.loc[2048, "saving_bytes"] == 188 * MIB
    assert fused.loc[2048, "saving_frac"] == pytest.approx(188 / 200)


def test_linear_growth_is_reported_with_its_slope():
    results = []
    for tokens in (1024, 2048, 4096, 8192):
        results += [_cell("torch", tokens, 10 + tokens / 8), _cell("fusedce", tokens, 10 + tokens / 1024)]
    texts = _texts(results)
    scaling = next(t for t in texts if "linearly" in t)
    # saving = tokens/8 − tokens/1024 MiB → per 1024 tokens: 128 − 1 = 127 MiB
    assert "127 MiB per 1k tokens" in scaling
    assert "fusedce saves" in texts[0] and "at 8k tokens" in texts[0].lower()


def test_a_back_end_using_more_than_torch_is_not_called_a_saving():
    texts = _texts([_cell("torch", 64, 10), _cell("fusedce", 64, 15)])
    memory = next(t for t in texts if "logits" in t)
    assert "fusedce uses 5.00 MiB (50%) more than torch" in memory
    assert not any("saves -" in t for t in texts)


def test_oom_finding_names_the_first_failing_size_and_who_still_ran():
    texts = _texts([_cell("torch", 1024, 100), _cell("fusedce", 1024, 10),
                    _cell("torch", 4096, None, status="oom"), _cell("fusedce", 4096, 20)])
    oom = next(t for t in texts if "out of memory" in t)
    assert oom.startswith("torch runs out of memory at 4k tokens")
    assert "fusedce (20.0 MiB)" in oom and "largest size that ran: 1k" in oom


def test_torch_oom_leaves_the_saving_unknown_and_says_why_in_the_table():
    tables = cell_tables(results_frame([_cell("torch", 4096, None, status="oom"), _cell("fusedce", 4096, 20)]))
    rows = tables[0].rows.set_index("back-end")
    assert rows.loc["fusedce", "saving vs torch"] == "torch oom"
    assert rows.loc["torch", "peak extra"] == "OOM"


def test_parity_failure_is_a_finding_and_a_failed_verdict():
    bad = _cell("fusedce", 64, 5, err=0.2)
    assert parity_verdict(bad).passed is False
    texts = _texts([_cell("torch", 64, 10), bad])
    assert any(t.startswith("PARITY FAILURE: fusedce") for t in texts)


def test_nan_error_fails_parity():
    cell = _cell("fusedce", 64, 5)
    cell.parity.grad_weight = math.nan
    verdict = parity_verdict(cell)
    assert verdict.passed is False and verdict.worst_name == "grad_weight"


def test_cells_without_errors_have_no_verdict():
    verdict = parity_verdict(_cell("torch", 64, None, status="oom"))
    assert verdict.passed is None and verdict.worst is None


@pytest.mark.parametrize("mode, tolerance", [("amp-bf16", 3e-2), ("bf16", 3e-2), ("amp-fp16", 4e-3), ("fp32", 2e-3)])
def test_tolerances_per_mode(mode, tolerance):
    assert tolerance_for(mode) == tolerance
    inside = _cell("fusedce", 64, 5, err=0.9 * tolerance, mode=mode)
    outside = _cell("fusedce", 64, 5, err=1.1 * tolerance, mode=mode)
    assert parity_verdict(inside).passed and not parity_verdict(outside).passed


def test_unknown_mode_names_the_argument():
    with pytest.raises(ValueError, match="mode: unknown precision mode 'int8'"):
        tolerance_for("int8")


def test_a_resumed_cell_measured_twice_counts_once():
    first, second = _cell("torch", 64, 10), _cell("torch", 64, 11)
    frame = results_frame([first, second])
    assert len(frame) == 1 and frame.loc[0, "peak_bytes"] == 11 * MIB


# --- who wins: lowest memory, fastest, frontier (planted frames) --------------------------------

from planted import cell, frame  # noqa: E402


def _topic(cells, topic):
    found = [f.text for f in compute_findings(frame(*cells)) if f.topic == topic]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_the_lowest_memory_back_end_is_named_at_every_size_whoever_it_is_on_the_cpu():
    cells = []
    for tokens, fused, compiled in ((1024, 10, 14), (2048, 20, 16), (4096, 40, 48)):
        cells += [cell("torch", tokens, 100, cpu=True), cell("torch-compile", tokens, compiled, cpu=True),
                  cell("fusedce", tokens, fused, cpu=True)]
    text = _topic(cells, "ranking")
    assert text.startswith("The lowest peak is fusedce's at 1k tokens (10.0 MiB at 1k, next torch-compile 14.0 MiB); "
                           "torch-compile's at 2k tokens (16.0 MiB at 2k, next fusedce 20.0 MiB); "
                           "fusedce's at 4k tokens (40.0 MiB at 4k, next torch-compile 48.0 MiB).")
    assert text.endswith("Peak extra at 4k tokens: fusedce 40.0 MiB, torch-compile 48.0 MiB, torch 100 MiB.")


def test_one_back_end_lowest_everywhere_is_said_once():
    cells = [cell(b, t, peak * t / 1024) for t in (1024, 2048) for b, peak in (("torch", 100), ("liger", 8))]
    assert _topic(cells, "ranking").startswith("liger holds the lowest peak at every size measured (1k and 2k tokens).")


def test_a_faster_back_end_that_failed_parity_is_never_called_the_fastest():
    cells = [cell("torch", 4096, 100, time_ms=5.0), cell("fusedce", 4096, 10, time_ms=3.0),
             cell("cce", 4096, 8, time_ms=1.0, err=0.2)]
    text = _topic(cells, "speed")
    assert text.startswith("fusedce is the fastest at 4k tokens.")
    assert "cce is the fastest" not in text
    assert "cce 1.00 ms (failed parity)" in text
    assert ("cce was quicker at 4k tokens (1.00 ms at 4k) but failed parity, so it is not counted as the "
            "fastest.") in text


def test_on_the_cpu_overlapping_time_ranges_are_within_noise_not_a_fastest():
    cells = [cell("torch", 1024, 100, time_ms=5.0, spread=(4.0, 6.5), cpu=True),
             cell("fusedce", 1024, 10, time_ms=4.8, spread=(4.5, 6.0), cpu=True),
             cell("torch", 4096, 400, time_ms=20.0, spread=(19.0, 22.0), cpu=True),
             cell("fusedce", 4096, 40, time_ms=10.0, spread=(9.0, 11.0), cpu=True)]
    text = _topic(cells, "speed")
    assert text.startswith("At 1k tokens the times of torch and fusedce are within noise (their min–max ranges "
                           "overlap), so none is called the fastest; fusedce is the fastest at 4k tokens.")
    assert "fusedce 10.0 ms (9.00 ms–11.0 ms)" in text


def test_on_the_cpu_a_back_end_without_a_time_range_is_not_called_the_fastest():
    cells = [cell("torch", 1024, 100, time_ms=5.0, cpu=True), cell("fusedce", 1024, 10, time_ms=1.0, cpu=True)]
    for c in cells:
        c.time_ms_min = c.time_ms_max = None
    assert "within noise" in _topic(cells, "speed")


def test_torch_native_is_in_every_comparison_it_was_measured_in():
    cells = [cell("torch", 2048, 100, time_ms=4.0), cell("torch-native", 2048, 30, time_ms=2.0),
             cell("fusedce", 2048, 10, time_ms=3.0)]
    assert "torch-native 30.0 MiB" in _topic(cells, "ranking")
    speed = _topic(cells, "speed")
    assert speed.startswith("torch-native is the fastest at 2k tokens.") and "fusedce 3.00 ms (1.50×)" in speed
    assert "torch-native (30.0 MiB, 2.00 ms)" in _topic(cells, "frontier")


def test_the_frontier_finding_names_the_pareto_set_and_who_dominates_the_rest():
    cells = [cell("torch", 1024, 60, time_ms=2.0), cell("fusedce", 1024, 6, time_ms=2.0)]  # a smaller size
    cells += [cell("torch", 65536, 100, time_ms=5.0), cell("torch-compile", 65536, 50, time_ms=2.0),
              cell("fusedce", 65536, 10, time_ms=3.0), cell("liger", 65536, 12, time_ms=4.0),
              cell("cce", 65536, 5, time_ms=1.0, err=0.2)]
    text = _topic(cells, "frontier")
    assert text == ("On 64×1000 at 64k tokens the time–memory frontier is fusedce (10.0 MiB, 3.00 ms) and "
                    "torch-compile (50.0 MiB, 2.00 ms); torch is dominated by torch-compile and fusedce, liger is "
                    "dominated by fusedce; cce failed parity and is left out.")


def test_the_frontier_finding_uses_the_largest_size_two_back_ends_ran_and_names_the_oom():
    cells = [cell("torch", 1024, 60, time_ms=2.0), cell("fusedce", 1024, 6, time_ms=1.0),
             cell("torch", 8192, None, status="oom"), cell("fusedce", 8192, 48, time_ms=8.0)]
    assert _topic(cells, "frontier") == ("On 64×1000 at 1k tokens fusedce (6.00 MiB, 1.00 ms) alone is on the "
                                         "time–memory frontier; torch is dominated by fusedce.")


def test_a_sentence_that_begins_with_the_winner_names_the_sizes_in_lower_case():
    cells = [cell(b, t, 10, time_ms=ms, spread=(lo, hi), cpu=True)
             for t, timings in ((1024, (("torch", 5.0, 4.9, 5.1), ("fusedce", 9.0, 8.9, 9.1))),
                                (4096, (("torch", 20.0, 18.0, 24.0), ("fusedce", 21.0, 19.0, 23.0))))
             for b, ms, lo, hi in timings]
    text = _topic(cells, "speed")
    assert text.startswith("torch is the fastest at 1k tokens; at 4k tokens the times of"), text
