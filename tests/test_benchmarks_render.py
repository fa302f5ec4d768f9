"""Goal checks, the Markdown table and the results file (benchmarks/goals.py, render.py, results.py)."""
import dataclasses

import pytest

from benchmarks import render
from benchmarks.goals import check_goals
from benchmarks.measure import GemmRate
from benchmarks.protocol import GIB, MIB, Row, floor_bytes, step_flops
from benchmarks.results import BenchRun, BenchSettings, Environment, load_run, result_stem, save_run, slug
from fusedce_profiler.instrument.records import CellResult, CellSpec, Parity

ROW = Row(8192, 4096, 128256, "Llama-3-8B head")
FLOOR = floor_bytes(ROW, "bf16")
GEMM_TFLOPS = 700.0


def _env(**overrides) -> Environment:
    fields = dict(gpu="NVIDIA H200", driver="580.159.04", cuda="13.0", torch="2.11.0+cu130", triton="3.6.0",
                  liger_kernel="0.8.5", cut_cross_entropy="25.1.1", fusedce="0.1.0", fusedce_commit="abc1234",
                  python="3.12.3", date="2026-12-02T15:00:00+00:00", pytorch_cuda_alloc_conf="")
    return Environment(**{**fields, **overrides})


def _cell(backend: str, *, peak: float | None = None, ms: float | None = None, err: float = 0.002,
          status: str = "ok", mode: str = "bf16", message: str = "") -> CellResult:
    spec = CellSpec(backend=backend, tokens=ROW.tokens, vocab=ROW.vocab, hidden=ROW.hidden, mode=mode)
    if status != "ok":
        return CellResult(spec=spec, status=status, message=message, floor_bytes=FLOOR)
    return CellResult(spec=spec, peak_step_bytes=round(peak), floor_bytes=FLOOR, time_ms=ms, times_ms=[ms],
                      parity=Parity(loss=err / 10, grad_hidden=err, grad_weight=err / 2))


def _run(fusedce: CellResult, *others: CellResult) -> BenchRun:
    cells = list(others) or [_cell("torch", peak=5.871 * GIB, ms=40.8, err=0.0017),
                             _cell("torch_compile", peak=2.998 * GIB, ms=38.7, err=0.0017)]
    return BenchRun(environment=_env(), settings=BenchSettings(rows=[ROW.shape], modes=["bf16"],
                                                               impls=["torch", "torch_compile", "fusedce"]),
                    rows=[ROW], gemm=[GemmRate(ROW.tokens, ROW.hidden, ROW.vocab, 10.0, GEMM_TFLOPS)],
                    cells=[*cells, fusedce])


def _check(run: BenchRun):
    (check,) = check_goals(run.cells, {(ROW.tokens, ROW.hidden, ROW.vocab): GEMM_TFLOPS})
    return check


def test_goals_are_met_by_a_cell_at_the_floor_faster_and_more_accurate():
    check = _check(_run(_cell("fusedce", peak=FLOOR, ms=38.0, err=0.0010)))
    assert (check.memory, check.time, check.parity) == (True, True, True) and check.met()


def test_memory_goal_boundary_is_ten_percent_plus_128_mib():
    at_limit = int(1.10 * FLOOR + 128 * MIB)
    assert _check(_run(_cell("fusedce", peak=at_limit, ms=38.0, err=0.001))).memory is True
    assert _check(_run(_cell("fusedce", peak=at_limit + 1, ms=38.0, err=0.001))).memory is False


def test_time_goal_compares_with_torch_compile_of_the_same_run():
    assert _check(_run(_cell("fusedce", peak=FLOOR, ms=38.7, err=0.001))).time is True
    assert _check(_run(_cell("fusedce", peak=FLOOR, ms=38.8, err=0.001))).time is False


def test_parity_goal_fails_when_any_error_exceeds_eager_torchs():
    worse_grad_w = _cell("fusedce", peak=FLOOR, ms=30.0, err=0.001)
    worse_grad_w.parity = dataclasses.replace(worse_grad_w.parity, grad_weight=0.0018)
    assert _check(_run(worse_grad_w)).parity is False


def test_gemm_stretch_is_eighty_percent_of_the_measured_rate():
    fast_ms = step_flops(ROW) / (0.8 * GEMM_TFLOPS * 1e12) * 1e3
    assert _check(_run(_cell("fusedce", peak=FLOOR, ms=fast_ms * 0.999))).gemm_stretch is True
    assert _check(_run(_cell("fusedce", peak=FLOOR, ms=fast_ms * 1.01))).gemm_stretch is False


def test_a_failed_fusedce_cell_meets_no_goal_and_a_missing_peer_gives_no_verdict():
    failed = _check(_run(_cell("fusedce", status="oom", message="CUDA out of memory")))
    assert (failed.memory, failed.time, failed.parity) == (False, False, False)
    alone = _check(_run(_cell("fusedce", peak=FLOOR, ms=1.0, err=0.001),
                        _cell("torch_compile", status="oom")))
    assert alone.time is None and alone.parity is None and not alone.met()


def test_goals_compare_only_cells_of_the_same_mode():
    amp_compile = _cell("torch_compile", peak=GIB, ms=1.0, mode="amp-bf16")
    check = _check(_run(_cell("fusedce", peak=FLOOR, ms=30.0, err=0.001),
                        _cell("torch", peak=GIB, ms=40.0, err=0.002), amp_compile))
    assert check.time is None


def test_markdown_table_has_the_anchor_columns_and_the_numbers():
    text = render.render_markdown(_run(_cell("fusedce", peak=FLOOR, ms=38.0, err=0.001)))
    lines = text.splitlines()
    assert ("| N×H×V | mode | impl | peak extra GiB | × floor | ms | TFLOP/s | % GEMM | rel err loss "
            "| rel err grad_h | rel err grad_W | goals: mem · time · parity (stretch) |") in lines
    assert "| 8192×4096×128256 (Llama-3-8B head) | bf16 | torch | 5.871 | 5.64 | 40.8 | 633 | 90% | 0.0002 " \
           "| 0.0017 | 0.0008 |  |" in lines
    assert "|  | bf16 | fusedce | 1.041 | 1.00 | 38.0 | 680 | 97% | 0.0001 | 0.0010 | 0.0005 | ✓ · ✓ · ✓ (✓) |" \
           in lines
    assert "NVIDIA H200" in lines[0] and "liger-kernel 0.8.5" in text and "cut-cross-entropy 25.1.1" in text


def test_markdown_floors_table_gives_the_time_floor_at_the_measured_gemm_rate():
    text = render.render_markdown(_run(_cell("fusedce", peak=FLOOR, ms=38.0)))
    floor_ms = step_flops(ROW) / (GEMM_TFLOPS * 1e12) * 1e3
    assert f"| 8192×4096×128256 | bf16 | 1.041 | 1.270 | 700 | {floor_ms:.1f} |" in text.splitlines()


def test_markdown_marks_cells_without_numbers_and_lists_their_reason():
    run = _run(_cell("fusedce", status="error", message="RuntimeError: boom"))
    text = render.render_markdown(run)
    assert "|  | bf16 | fusedce | error | – | – | – | – | – | – | – | ✗ · ✗ · ✗ (✗) |" in text.splitlines()
    assert "fusedce: error: RuntimeError: boom" in text


def test_console_table_has_one_line_per_cell_plus_a_header():
    run = _run(_cell("fusedce", peak=FLOOR, ms=38.0))
    assert len(render.render_console(run).splitlines()) == 1 + len(run.cells)


@pytest.mark.parametrize("value, text", [(0.00171, "0.0017"), (0.0, "0.0000"), (3.2e-6, "3.2e-06"), (None, "–")])
def test_error_format_follows_the_anchor_table(value, text):
    assert render.fmt_error(value) == text


def test_results_file_round_trips_and_renders_from_the_command_line(tmp_path):
    run = _run(_cell("fusedce", peak=FLOOR, ms=38.0))
    path = tmp_path / "run.json"
    save_run(run, path)
    loaded = load_run(path)
    assert loaded.to_dict() == run.to_dict()
    assert render.main([str(path), "-o", str(tmp_path / "run.md")]) == 0
    assert (tmp_path / "run.md").read_text() == render.render_markdown(run)


def test_loading_a_file_of_another_format_fails_clearly(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"format": 0}')
    with pytest.raises(ValueError, match="format"):
        load_run(path)


def test_result_file_names_carry_gpu_date_and_variant():
    base = BenchSettings(rows=[], modes=[], impls=[])
    assert slug("NVIDIA H200") == "nvidia-h200"
    assert result_stem(_env(), base) == "nvidia-h200-2026-12-02"
    variant = dataclasses.replace(base, ignore_frac=0.3, all_options=True, tag="try2")
    assert result_stem(_env(), variant) == "nvidia-h200-2026-12-02-ignore30-all-options-try2"
