"""``fusedce-profile`` with no command, on the CPU, shrunk by FUSEDCE_PROFILE_SMOKE."""
import json

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile.defaults import CPU_HEADS, GPU_HEADS, SMOKE_ENV, default_run

SMOKE = {SMOKE_ENV: "1"}


@pytest.fixture(scope="module")
def default_run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("default") / "run"
    result = CliRunner().invoke(app, ["--device", "cpu", "--out", str(out)], env=SMOKE)
    return out, result


def test_default_run_exits_0_and_writes_a_complete_report(default_run_dir):
    out, result = default_run_dir
    assert result.exit_code == 0, result.output
    for name in ("results.jsonl", "results.csv", "summary.md", "report.html", "environment.json"):
        assert (out / name).is_file(), name
    assert {p.name for p in (out / "plots").glob("*.png")} >= {"peak_memory.png", "time.png", "parity.png"}
    assert f"Report: {out / 'summary.md'}" in " ".join(result.stdout.split())


def test_default_run_prints_one_line_per_cell_when_not_on_a_terminal(default_run_dir):
    _, result = default_run_dir
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert lines[0].startswith("[1/4] torch 32×64×512 amp-bf16: peak ")
    assert lines[-1].startswith("[4/4] fusedce 64×64×512")
    assert "\x1b[" not in result.stdout  # no colour codes off a terminal


def test_default_refuses_to_overwrite_a_previous_run(default_run_dir):
    out, _ = default_run_dir
    result = CliRunner().invoke(app, ["--device", "cpu", "--out", str(out)], env=SMOKE)
    assert result.exit_code == 2
    assert "not empty" in result.stderr and "--force" in result.stderr


def test_resume_of_a_finished_run_measures_nothing_new(default_run_dir):
    out, _ = default_run_dir
    before = (out / "results.jsonl").read_text()
    result = CliRunner().invoke(app, ["--device", "cpu", "--out", str(out), "--resume", "--json"], env=SMOKE)
    assert result.exit_code == 0, result.output
    assert (out / "results.jsonl").read_text() == before
    summary = json.loads(result.stdout)
    assert summary["cells"] == {"total": 4, "ok": 4} and summary["exit_code"] == 0


def test_real_defaults_cover_the_users_head_and_llama3_on_gpu_and_a_small_cpu_grid(monkeypatch):
    monkeypatch.delenv(SMOKE_ENV, raising=False)
    gpu = default_run("cuda")
    assert [(g.hidden[0], g.vocab[0]) for g in gpu.grids] == [(768, 32777), (4096, 128256)] == list(GPU_HEADS)
    assert all(g.tokens[0] == 1024 and g.modes == ("amp-bf16",) for g in gpu.grids)
    cpu = default_run("cpu")
    assert [(g.hidden[0], g.vocab[0]) for g in cpu.grids] == list(CPU_HEADS)
    assert "torch" in cpu.grids[0].backends and "fusedce" in cpu.grids[0].backends
    assert sum(len(g.cells()) for g in cpu.grids) <= 12


def test_a_cpu_without_a_native_bf16_product_gets_an_fp32_default_run_and_is_told_why(monkeypatch):
    """On an AVX2-only CPU, bf16 products ran ~100× slower than fp32: the amp-bf16 default run took
    91 s a step and never finished."""
    from fusedce_profile import defaults

    monkeypatch.delenv(SMOKE_ENV, raising=False)
    monkeypatch.setattr(defaults, "cpu_bf16_slowdown", lambda: 45.0)
    slow = default_run("cpu")
    assert all(g.modes == ("fp32",) for g in slow.grids)
    assert "fp32 (this CPU multiplies bf16 45× slower than fp32" in slow.description
    monkeypatch.setattr(defaults, "cpu_bf16_slowdown", lambda: 1.2)
    assert all(g.modes == ("amp-bf16",) for g in default_run("cpu").grids)
    monkeypatch.setattr(defaults, "cpu_bf16_slowdown", lambda: pytest.fail("a GPU run never probes the CPU"))
    assert all(g.modes == ("amp-bf16",) for g in default_run("cuda").grids)


def test_the_bf16_probe_is_a_ratio_of_two_timed_products():
    from fusedce_profile.defaults import cpu_bf16_slowdown

    assert cpu_bf16_slowdown((8, 16, 32)) > 0


def test_the_cpu_default_run_meters_the_eager_and_fused_losses_on_their_first_step(default_run_dir):
    out, _ = default_run_dir
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(r["spec"]["backend"], r["extra"]["warmup_steps"]) for r in rows} == {("torch", 0), ("fusedce", 0)}
