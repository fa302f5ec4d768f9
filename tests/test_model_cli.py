"""The model, parity and doctor sub-commands through typer's CliRunner: files and exit codes."""
import json

import pytest
import torch.nn.functional as F
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce.options import LossOptions
from fusedce_profiler.instrument.backends import torch_loss

runner = CliRunner()


def scaled_loss(hidden, weight, target, bias, **options):
    return 1.1 * torch_loss(hidden, weight, target, bias, LossOptions(**options))


def good_wrapper(model, input_ids, labels):
    logits = model(input_ids)[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def unshifted_wrapper(model, input_ids, labels):
    logits = model(input_ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def test_model_command_writes_its_report(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["model", "--device", "cpu", "--preset", "tiny", "--batch", "2", "--seq", "16",
                                 "--backend", "torch", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["results"][0]["status"] == "ok" and summary["results"][0]["peak_bytes"] > 0
    text = (out / "summary.md").read_text()
    assert "composition of the peak" in text and "torch peaks at" in text
    assert (out / "plots" / "breakdown.png").stat().st_size > 5000
    assert len((out / "model_results.jsonl").read_text().splitlines()) == 1


def test_model_command_refuses_a_non_empty_folder_without_force(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    result = runner.invoke(app, ["model", "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 2


@pytest.mark.parametrize("args", [
    ["model", "--device", "cpu", "--preset", "gpt5"],
    ["model", "--device", "cpu", "--backend", "nope"],
    ["model", "--device", "cpu", "--fit-axis", "layers"],
    ["model", "--device", "cpu", "--attention", "flash"],
    ["parity", "--device", "cpu", "--reduction", "none"],
    ["parity", "--device", "cpu", "--backend", "torch"],
    ["doctor", "--loss", "no_colon"],
])
def test_bad_input_exits_2(args, tmp_path):
    result = runner.invoke(app, args + ["--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output


def test_bad_config_file_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "vocab_size": 10}))
    result = runner.invoke(app, ["model", "--device", "cpu", "--config", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "ffn_factor" in result.output


def test_parity_passes_fusedce_with_exit_0_and_draws_its_curves(tmp_path):
    """The failing exit code (1) and its report: the next test, on the same settings."""
    common = ["parity", "--device", "cpu", "--steps", "20", "--batch", "2", "--seq", "16"]
    ok = runner.invoke(app, common + ["--backend", "fusedce", "--out", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "ok" / "plots" / "parity_loss.png").stat().st_size > 5000
    assert "PASS" in (tmp_path / "ok" / "summary.md").read_text()


def test_doctor_exit_codes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out, doctor writes a new folder here
    good = runner.invoke(app, ["doctor", "--loss", f"{__name__}:good_wrapper", "--out", str(tmp_path / "g")])
    assert good.exit_code == 0, good.output
    assert "| targets shifted" in (tmp_path / "g" / "summary.md").read_text()
    bad = runner.invoke(app, ["doctor", "--loss", f"{__name__}:unshifted_wrapper"])
    assert bad.exit_code == 1
    assert "fail" in bad.output and "targets shifted" in bad.output


def test_parity_compares_several_backends_with_a_seed_and_reports_each_ones_gap(tmp_path):
    out = tmp_path / "control"
    result = runner.invoke(app, ["parity", "--device", "cpu", "--steps", "20", "--batch", "2", "--seq", "16",
                                 "--backend", "fusedce", "--backend", f"{__name__}:scaled_loss", "--seed", "3",
                                 "--out", str(out)])
    assert result.exit_code == 1, result.output  # the scaled loss diverges; fusedce does not
    saved = json.loads((out / "parity.json").read_text())
    assert saved["settings"]["seed"] == 3
    verdicts = {v["backend"]: v for v in saved["verdicts"]}
    assert verdicts[f"{__name__}:scaled_loss"]["passed"] is False and verdicts["fusedce"]["passed"] is True
    assert "Noise floor: the control" in (out / "summary.md").read_text()
    assert [c["backend"] for c in saved["curves"]] == ["torch", "torch, perturbed", "fusedce",
                                                       f"{__name__}:scaled_loss"]
    text = (out / "summary.md").read_text()
    assert "seed 3" in text and "| torch, perturbed | control |" in text
    gaps = [line for line in text.splitlines() if " vs torch: at most " in line]
    assert len(gaps) == 3 and "fusedce vs torch" in gaps[1] and "scaled_loss vs torch" in gaps[2]
    # The scaled loss is 10% above torch's at step 0 already, at the same weights and batch.
    assert "at step" in gaps[2] and "above 2e-02 on" in gaps[2]
    assert "fusedce vs torch: at most" in result.output


def test_model_seed_reaches_the_job(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["model", "--device", "cpu", "--preset", "tiny", "--batch", "2", "--seq", "16",
                                 "--backend", "torch", "--seed", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads((out / "model_results.jsonl").read_text().splitlines()[0])
    assert row["job"]["seed"] == 5 and row["extra"]["wall_s"] > 0
