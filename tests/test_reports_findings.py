"""Findings and parity verdicts computed from small hand-made result sets."""
import math

import pytest

from profiler.records import CellResult, CellSpec, Parity
from profiler.tolerances import parity_verdict, tolerance_for
from reports import compute_findings, results_frame
from reports.tables import cell_tables

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
