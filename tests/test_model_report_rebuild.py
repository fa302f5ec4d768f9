"""``fusedce-profile report DIR`` on model and parity folders: rebuilt from the stored files alone."""
import dataclasses
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument.step.jobs import load_model_results
from fusedce_reports.model_report import missing_rows

FIXTURES = Path(__file__).parent / "fixtures"


def _copy(tmp_path: Path, name: str) -> Path:
    run = tmp_path / name
    shutil.copytree(FIXTURES / name, run)
    return run


def test_report_rebuilds_a_model_folder_and_names_the_rows_a_cut_run_never_wrote(tmp_path):
    run = _copy(tmp_path, "h200_model")
    result = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["incomplete"] == ["+eval rows for fusedce, cce were not measured: the run ended early "
                                     "(model_results.jsonl has +eval rows for torch only)."]
    assert sorted(Path(p).name for p in summary["plots"]) == ["breakdown.png", "reserved.png"]
    text = (run / "summary.md").read_text()
    assert "**Incomplete run.** +eval rows for fusedce, cce were not measured" in text
    # torch's row at B=34 as measured: 25127830016 bytes allocated, 31797870592 on nvidia-smi.
    assert "| user-gpt B=34 T=1024 | torch | ok | 23.4 GiB | loss | 10.7 GiB | 46% |" in text
    assert "29.6 GiB" in text
    assert "error: AssertionError: Backwards requires embeddings to be bf16 or fp16" in text


def test_rebuilding_a_model_folder_twice_gives_the_same_summary(tmp_path):
    run = _copy(tmp_path, "h200_model")
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    first = (run / "summary.md").read_text()
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0
    assert (run / "summary.md").read_text() == first


def test_a_run_with_every_eval_row_or_none_is_not_called_incomplete():
    results = load_model_results(FIXTURES / "h200_model").records
    plain = [r for r in results if not r.job.eval_step]
    assert missing_rows(plain) == []  # no +eval row at all: nothing says one was asked for
    evaluated = [dataclasses.replace(r, job=dataclasses.replace(r.job, eval_step=True)) for r in plain]
    assert missing_rows(plain + evaluated) == []
    assert missing_rows(plain + evaluated[:1]) != []


def test_report_rebuilds_a_parity_folder_and_exits_1_when_a_back_end_failed(tmp_path):
    run = _copy(tmp_path, "h200_parity")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    text = (run / "summary.md").read_text()
    assert text.startswith("# fusedce-profile parity: PASS")
    assert "| fusedce | pass | 1.9966 | 6.2e-03 | 1.6e-01 (step 95) | 7.2e-03 (lm_head gradient at step 100) |" in text
    # The peak step is recomputed from the stored losses (this run predates storing it).
    assert "**fusedce vs torch: at most 16.1% at step 95** (3.5344 vs 3.0450)" in text
    assert (run / "plots" / "parity_loss.png").is_file()

    raw = json.loads((run / "parity.json").read_text())
    raw["verdicts"][0].update(passed=False, reasons=["planted failure"])
    (run / "parity.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 1
    assert (run / "summary.md").read_text().startswith("# fusedce-profile parity: FAIL")


def test_report_of_a_malformed_model_results_file_names_the_line_it_skipped(tmp_path):
    run = _copy(tmp_path, "h200_model")
    lines = (run / "model_results.jsonl").read_text().splitlines()
    (run / "model_results.jsonl").write_text("\n".join(lines[:1] + ['{"job": {}}']) + "\n")
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "model_results.jsonl:2" in result.stdout
    assert "model_results.jsonl:2" in (run / "summary.md").read_text()


def test_a_parity_folder_cut_before_a_back_end_trained_says_so(tmp_path):
    run = _copy(tmp_path, "h200_parity")
    raw = json.loads((run / "parity.json").read_text())
    raw["settings"]["backends"] = ["fusedce", "liger"]  # liger was asked for but never trained
    (run / "parity.json").write_text(json.dumps(raw))
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    text = (run / "summary.md").read_text()
    assert "**Incomplete run.** liger did not train: the run ended early." in text
    assert "| liger | not run |" in text
