"""``doctor --out DIR`` stores doctor.json and renders it; ``report DIR`` rebuilds the folder
from doctor.json alone and exits 1 when an item failed, as doctor does."""
from __future__ import annotations

import json

import pytest
import torch

from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce import linear_cross_entropy
from fusedce_profiler.instrument import store
from fusedce_profiler.judgements.doctor.doctor import Check, DoctorRun

runner = CliRunner()
SHIFT = "targets shifted (position t predicts labels[t+1])"


def test_doctor_stores_its_checks_renders_the_summary_and_says_where(tmp_path):
    out = tmp_path / "doc"
    result = runner.invoke(app, ["doctor", "--loss", "test_model_cli:unshifted_wrapper", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert f"report: {out / 'summary.md'}" in result.stdout
    stored = DoctorRun.from_dict(store.read_json(out / store.DOCTOR_FILE))
    assert stored.loss == "test_model_cli:unshifted_wrapper" and stored.config == "tiny" and not stored.passed
    assert {c.item: c.verdict for c in stored.checks}[SHIFT] == "fail"
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# fusedce-profile doctor: FAIL")
    assert "Loss wrapper test_model_cli:unshifted_wrapper, checked on the tiny model" in summary
    assert r"| targets shifted (position t predicts labels\[t+1\]) | fail |" in summary
    assert (out / store.ENVIRONMENT_FILE).is_file() and "<summary>Environment</summary>" in summary


def _write(folder, checks, loss="pkg.mod:loss"):
    store.write_json(folder / store.DOCTOR_FILE, DoctorRun(loss, "tiny", checks).to_dict())


def test_report_rebuilds_a_doctor_folder_and_exits_1_when_an_item_failed(tmp_path):
    _write(tmp_path, [Check("loss value", "pass", "yours 1.0, reference 1.0"),
                      Check(SHIFT, "fail", "the last position gets gradient")])
    result = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["doctor_passed"] is False and summary["parity_passed"] is None and summary["exit_code"] == 1
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# fusedce-profile doctor: FAIL") and "2 items, 1 failed" in text
    assert "**Failed:** targets shifted" in text


def test_report_of_a_passing_doctor_folder_exits_0_and_says_pass(tmp_path):
    _write(tmp_path, [Check("loss value", "pass", "ok"), Check("final norm applied", "unclear", "no response")])
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "doctor: PASS" in result.stdout and f"report: {tmp_path / 'summary.md'}" in result.stdout


def test_report_reads_a_doctor_json_holding_a_bare_list_of_checks(tmp_path):
    store.write_json(tmp_path / store.DOCTOR_FILE, [{"item": "loss value", "verdict": "fail", "evidence": "off"}])
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1
    assert "a loss wrapper (not recorded)" in (tmp_path / "summary.md").read_text()


def test_report_of_a_damaged_doctor_json_is_bad_input_naming_the_field(tmp_path):
    store.write_json(tmp_path / store.DOCTOR_FILE, {"loss": "x", "config": "tiny", "checks": [{"item": "a"}]})
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "checks[0].verdict" in result.output


def test_doctor_on_the_users_model_passes_a_correct_wiring_and_exits_0(tmp_path):
    result = runner.invoke(app, ["doctor", "--model", "tests.doctor_models:tied_bias", "--loss",
                                 "test_model_doctor:correct", "--device", "cpu", "--out", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output
    stored = DoctorRun.from_dict(store.read_json(tmp_path / "ok" / store.DOCTOR_FILE))
    assert stored.passed and stored.head["bias"] == "head.inner.bias" and stored.head["tied"]
    assert stored.mode == "fp32" and stored.device == "cpu" and stored.parameters > 0
    summary = (tmp_path / "ok" / "summary.md").read_text()
    assert "naive (reference)" in summary and "head.inner" in summary


def test_doctor_on_the_users_model_shows_the_evidence_of_a_detached_body_and_exits_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out, doctor writes a new folder here
    result = runner.invoke(app, ["doctor", "--model", "tests.doctor_models:untied", "--loss",
                                 "test_model_doctor:detached_hidden", "--device", "cpu"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())  # the console wraps long lines
    body = text[text.index("gradient reaches the body:"):]
    assert text[:text.index("gradient reaches the body:")].rstrip().endswith("fail ]")
    assert "detached" in body.split("[")[0] and "blocks.0" in body.split("[")[0]
    assert "not checked" in text and "depends on “gradient reaches the body”" in text


def test_doctor_refuses_a_model_too_large_for_the_cpu_in_one_line_before_building_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folder goes there
    result = runner.invoke(app, ["doctor", "--preset", "user-gpt", "--loss", "test_model_doctor:correct",
                                 "--device", "cpu"])
    assert result.exit_code == 2
    message = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(message) == 1 and "above the CPU limit of 50 M" in message[0] and "--device cuda" in message[0]


def test_doctor_bad_mode_exits_2_naming_the_option():
    result = runner.invoke(app, ["doctor", "--loss", "test_model_doctor:correct", "--mode", "bf16"])
    assert result.exit_code == 2 and "--mode" in result.output


@pytest.mark.parametrize("model, loss, code, failed", [
    ("examples.doctor_losses:fixed_model", "examples.doctor_losses:fused_loss", 0, set()),
    ("examples.user_model:build", "examples.doctor_losses:reports_loss", 1, {"tie", "weight"}),
    ("examples.doctor_losses:fixed_model", "examples.doctor_losses:detached_loss", 1, {"body"}),
])
def test_the_readme_doctor_examples_exit_as_documented(tmp_path, model, loss, code, failed):
    out = tmp_path / "d"
    result = runner.invoke(app, ["doctor", "--model", model, "--loss", loss, "--device", "cpu", "--out", str(out)])
    assert result.exit_code == code, result.output
    stored = DoctorRun.from_dict(store.read_json(out / store.DOCTOR_FILE))
    assert {c.key for c in stored.checks if c.verdict == "fail"} == failed


def hf_correct(model, batch):
    hidden = model.model(batch["input_ids"]).last_hidden_state[:, :-1]
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                batch["labels"][:, 1:].reshape(-1))


def hf_no_grad(model, batch):
    with torch.no_grad():
        hidden = model.model(batch["input_ids"]).last_hidden_state[:, :-1]
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                batch["labels"][:, 1:].reshape(-1))


@pytest.mark.parametrize("tied", [False, True])
def test_doctor_on_a_hugging_face_model_passes_its_wiring_and_catches_a_no_grad_body(tmp_path, tied):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install \"fusedce[hf]\")")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
                                  "vocab_size": 128, "max_position_embeddings": 64, "tie_word_embeddings": tied}))
    # the compile check traces the Hugging Face model (the slowest check on the CPU): once, untied
    compile_check = [] if not tied else ["--compile-backend", "none"]
    good = runner.invoke(app, ["doctor", "--hf", str(config), "--loss", f"{__name__}:hf_correct", "--device", "cpu",
                               *compile_check, "--out", str(tmp_path / "g")])
    assert good.exit_code == 0, good.output
    head = DoctorRun.from_dict(store.read_json(tmp_path / "g" / store.DOCTOR_FILE)).head
    assert head["tied"] is tied and head["bias"] is None
    bad = runner.invoke(app, ["doctor", "--hf", str(config), "--loss", f"{__name__}:hf_no_grad", "--device", "cpu",
                              "--compile-backend", "none", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 1, bad.output
    failed = {c.key for c in DoctorRun.from_dict(store.read_json(tmp_path / "b" / store.DOCTOR_FILE)).checks
              if c.verdict == "fail"}
    assert failed == {"body"}


def test_a_non_empty_folder_is_refused_without_suggesting_a_resume_doctor_does_not_have(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["doctor", "--loss", "examples.doctor_losses:correct", "--device", "cpu",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "not a run folder (it holds notes.txt, and no run's record)" in " ".join(result.output.split())
    assert "choose a new or empty folder" in " ".join(result.output.split())
    assert "--resume" not in result.output  # doctor has none, and no flag would let a run into this folder
