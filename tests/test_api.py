"""Every command as a Python function (``fusedce_profile``): on the CPU at tiny sizes, each writes
the folder the command writes for the same options, returns the records it stored, and refuses
bad input with :class:`~fusedce_profile.errors.UsageError` before anything is written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile.errors import UsageError
from run_records import plant_environment

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

GRID = dict(tokens=[32], vocab=[256], hidden=[32], backend=["torch", "fusedce"], mode=["fp32"], device="cpu",
            repeats=1)
GRID_ARGS = ["grid", "--tokens", "32", "--vocab", "256", "--hidden", "32", "--backend", "torch,fusedce", "--mode",
             "fp32", "--device", "cpu", "--repeats", "1"]
MODEL = dict(preset="tiny", backend=["torch", "fusedce"], batch=2, seq=16, device="cpu", trace=False)
MODEL_ARGS = ["model", "--preset", "tiny", "--backend", "torch", "--backend", "fusedce", "--batch", "2", "--seq",
              "16", "--device", "cpu", "--no-trace"]
PARITY = dict(preset="tiny", backend=["fusedce"], steps=10, batch=2, seq=8, device="cpu", control=False)
PARITY_ARGS = ["parity", "--preset", "tiny", "--backend", "fusedce", "--steps", "10", "--batch", "2", "--seq", "8",
               "--device", "cpu", "--no-control"]


def files_of(folder: Path) -> set[str]:
    """The folder's files, relative; worker logs by folder only (their names hold a pid)."""
    names = set()
    for path in folder.rglob("*"):
        if path.is_file() and path.name != ".lock":
            relative = path.relative_to(folder)
            names.add("logs/*" if relative.parts[0] == "logs" else relative.as_posix())
    return names


def timing_or_path(key: str) -> bool:
    """Keys whose values differ between two runs of the same cell: timings and log paths."""
    return key.endswith(("_ms", "_s")) or key.startswith("time") or key in ("log_path", "log")


def content(value):
    """A stored record without its timings and log paths, for comparing two runs (on the CPU the
    profiler's byte counts repeat exactly)."""
    if isinstance(value, dict):
        return {k: content(v) for k, v in value.items() if not timing_or_path(k)}
    if isinstance(value, list):
        return [content(v) for v in value]
    return value


def jsonl(path: Path) -> list:
    return [content(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def cli(args: list[str]):
    return runner.invoke(app, args)


@pytest.mark.slow
def test_run_grid_writes_what_grid_writes_and_returns_its_cells(tmp_path):
    from fusedce_profile import run_grid

    cells = run_grid(**GRID, out=tmp_path / "api")
    result = cli(GRID_ARGS + ["--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert [(c.spec.backend, c.status) for c in cells] == [("torch", "ok"), ("fusedce", "ok")]
    assert files_of(tmp_path / "api") == files_of(tmp_path / "cli")
    assert {"results.jsonl", "plan.json", "summary.md", "report.html", "results.csv"} <= files_of(tmp_path / "api")
    assert jsonl(tmp_path / "api" / "results.jsonl") == jsonl(tmp_path / "cli" / "results.jsonl")
    stored = [json.loads(line) for line in (tmp_path / "api" / "results.jsonl").read_text().splitlines()]
    assert [row["spec"]["backend"] for row in stored] == [c.spec.backend for c in cells]


@pytest.mark.slow
def test_profile_model_writes_what_model_writes_and_returns_its_rows(tmp_path):
    from fusedce_profile import profile_model

    rows = profile_model(**MODEL, out=tmp_path / "api")
    result = cli(MODEL_ARGS + ["--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert [(r.job.backend, r.status) for r in rows] == [("torch", "ok"), ("fusedce", "ok")]
    assert all(r.memory.peak > 0 for r in rows)
    assert files_of(tmp_path / "api") == files_of(tmp_path / "cli")
    assert jsonl(tmp_path / "api" / "model_results.jsonl") == jsonl(tmp_path / "cli" / "model_results.jsonl")


@pytest.mark.slow
def test_parity_writes_what_parity_writes_and_returns_its_report(tmp_path):
    from fusedce_profile import parity

    report = parity(**PARITY, out=tmp_path / "api")
    result = cli(PARITY_ARGS + ["--out", str(tmp_path / "cli")])
    assert result.exit_code in (0, 1), result.output
    assert [c.backend for c in report.curves] == ["torch", "fusedce"]
    assert files_of(tmp_path / "api") == files_of(tmp_path / "cli")
    stored = [json.loads((tmp_path / name / "parity.json").read_text()) for name in ("api", "cli")]
    assert stored[0]["settings"] == stored[1]["settings"]
    assert [c["losses"] for c in stored[0]["curves"]] == [c["losses"] for c in stored[1]["curves"]]


@pytest.mark.slow
def test_build_report_rebuilds_a_grid_folder_like_report_does(tmp_path):
    from fusedce_profile import build_report, run_grid

    cells = run_grid(**GRID, out=tmp_path / "run")
    (tmp_path / "run" / "summary.md").unlink()
    rebuilt = build_report(tmp_path / "run")
    assert [c.spec.key() for c in rebuilt] == [c.spec.key() for c in cells]
    assert "torch" in (tmp_path / "run" / "summary.md").read_text()
    result = cli(["report", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("call, fragment", [
    (lambda out: __import__("fusedce_profile").run_grid(**{**GRID, "tokens": [0]}, out=out), "--tokens"),
    (lambda out: __import__("fusedce_profile").run_grid(**{**GRID, "backend": ["nope"]}, out=out), "nope"),
    (lambda out: __import__("fusedce_profile").run_grid(**GRID, batch=[2], out=out), "--tokens"),
    (lambda out: __import__("fusedce_profile").profile_model(**{**MODEL, "preset": "gpt5"}, out=out), "gpt5"),
    (lambda out: __import__("fusedce_profile").profile_model(**MODEL, fit_axis="layers", out=out), "--fit-axis"),
    (lambda out: __import__("fusedce_profile").parity(**{**PARITY, "backend": ["torch"]}, out=out), "--backend"),
    (lambda out: __import__("fusedce_profile").parity(**{**PARITY, "steps": 3}, out=out), "--steps"),
    (lambda out: __import__("fusedce_profile").build_report(out), "not a folder"),
    (lambda out: __import__("fusedce_profile").StepRecorder(None, out), "model: expected the torch.nn.Module"),
    (lambda out: __import__("fusedce_profile").StepRecorder("gpt2", out), "got str"),
    (lambda out: __import__("fusedce_profile").StepRecorder(__import__("torch").nn.Linear(2, 2), out, steps=[-1]),
     "steps"),
])
def test_bad_input_raises_usage_error_before_anything_is_written(call, fragment, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(UsageError) as raised:
        call(out)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)
    assert not out.exists()


def test_a_non_empty_folder_names_only_the_options_the_command_has(tmp_path):
    from fusedce_profile import profile_model
    from fusedce_profile.folders import OutputDirError, prepare_out_dir

    (tmp_path / "model_results.jsonl").write_text("")  # a run folder: a run's records in it
    plant_environment(tmp_path)
    with pytest.raises(UsageError, match="--force to replace its previous run or --resume to continue it"):
        profile_model(**MODEL, out=tmp_path)
    with pytest.raises(OutputDirError) as raised:  # a command without --resume
        prepare_out_dir(tmp_path, force=False, resume=False, resume_option=False)
    assert "--force" in str(raised.value) and "--resume" not in str(raised.value)


@pytest.mark.slow
def test_parity_resume_keeps_the_trained_backends_and_trains_the_rest(tmp_path):
    import io

    from rich.console import Console

    from fusedce_profile import parity

    settings = {**PARITY, "backend": ["fusedce", "fusedce-min"]}
    whole = parity(**settings, out=tmp_path / "run")
    stored = json.loads((tmp_path / "run" / "parity.json").read_text())
    stored["curves"], stored["verdicts"] = stored["curves"][:-1], stored["verdicts"][:-1]  # cut before the last
    (tmp_path / "run" / "parity.json").write_text(json.dumps(stored))
    said = io.StringIO()
    resumed = parity(**settings, out=tmp_path / "run", resume=True, console=Console(file=said, width=200))
    assert "training with fusedce-min" in said.getvalue() and "training with torch" not in said.getvalue()
    assert [c.losses for c in resumed.curves] == [c.losses for c in whole.curves]
    assert resumed.passed == whole.passed
    with pytest.raises(UsageError, match="other options"):
        parity(**{**settings, "steps": 12}, out=tmp_path / "run", resume=True)


def test_the_package_exports_every_command_lazily():
    code = ("import sys, fusedce_profile as p; assert 'torch' not in sys.modules; "
            "import fusedce_profile.parity, fusedce_profile.report; "
            "names = ['run_grid', 'profile_model', 'parity', 'build_report', 'StepRecorder']; "
            "assert all(callable(getattr(p, n)) for n in names), [getattr(p, n) for n in names]; "
            "from fusedce_profile import parity; assert parity.__module__ == 'fusedce_profile.parity'; "
            "print(sorted(p.__all__))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert {"run_grid", "profile_model", "parity", "doctor", "explain", "build_report"} <= set(eval(shown.stdout))
