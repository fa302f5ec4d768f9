"""``fusedce-profile grid``: a tiny CPU grid, its options, and bad input (exit code 2)."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument.records import CellResult

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
TINY = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--repeats", "1"]


def _run(args, **kwargs):
    return CliRunner().invoke(app, args, **kwargs)


def _plain(text: str) -> str:
    """Output without the error box's borders and line breaks (typer wraps long messages)."""
    return " ".join(text.replace("│", " ").split())


def _rows(out):
    return [CellResult.from_dict(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "run"
    result = _run([*TINY, "--batch", "2,4", "--seq", "8", "--backend", "torch", "--backend", "fusedce",
                   "--ignore-frac", "0.25", "--out", str(out), "--json"])
    return out, result


def test_grid_measures_every_cell_and_prints_json_on_stdout(grid_run):
    out, result = grid_run
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # stdout holds only the JSON
    assert summary["cells"] == {"total": 4, "ok": 4}
    assert summary["summary_md"] == str(out.resolve() / "summary.md")
    assert {(r["backend"], r["tokens"]) for r in summary["rows"]} == {
        ("torch", 16), ("fusedce", 16), ("torch", 32), ("fusedce", 32)}
    assert "fusedce-profile grid: 4 cells" in result.stderr


def test_grid_passes_batch_seq_and_options_into_the_cells(grid_run):
    out, _ = grid_run
    specs = {(r.spec.batch, r.spec.seq, r.spec.tokens, r.spec.ignore_frac, r.spec.hidden, r.spec.vocab)
             for r in _rows(out)}
    assert specs == {(2, 8, 16, 0.25, 32, 256), (4, 8, 32, 0.25, 32, 256)}


def test_force_replaces_the_previous_run(grid_run, tmp_path):
    out, _ = grid_run
    result = _run([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert [r.spec.tokens for r in _rows(out)] == [8]


def test_config_file_in_our_format_sets_h_and_v(tmp_path):
    out = tmp_path / "run"
    result = _run(["grid", "--device", "cpu", "--config", str(CONFIGS / "tiny-head.json"),
                   "--tokens", "8", "--backend", "torch", "--repeats", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = _rows(out)
    assert (row.spec.hidden, row.spec.vocab) == (32, 256)


@pytest.mark.parametrize("args, message", [
    (["--backend", "nope"], "unknown back-end 'nope'; available: torch, torch-compile"),
    (["--backend", ""], "an empty back-end name in ''"),
    (["--backend", "torch,,fusedce"], "an empty back-end name in 'torch,,fusedce'"),
    (["--backend", "liger-patched"], "unknown back-end 'liger-patched'; available: torch, torch-compile, "
                                     "torch-native, fusedce, fusedce-min, fusedce-fast, liger, cce (or"),
    (["--tokens", "12x"], "'12x' is not a positive integer"),
    (["--tokens", "8", "--batch", "2", "--seq", "4"], "give --tokens, or --batch with --seq"),
    (["--batch", "2"], "--batch and --seq go together"),
    (["--mode", "int8"], "'int8' is unknown; choose one of amp-bf16, amp-fp16, bf16, fp32"),
    (["--ignore-frac", "1.5"], "--ignore-frac 1.5: expected a number ≥ 0 and < 1"),
    (["--z-loss", "-1"], "--z-loss -1.0: expected a finite number ≥ 0"),
    (["--softcap", "abc"], "'abc' is not a number"),
    (["--reduction", "max"], "reduction: 'max' is not one of mean, sum, none"),
    (["--preset", "gpt5"], "unknown preset 'gpt5'; known presets: gpt2"),
    (["--preset", "gpt2", "--config", "x.json"], "give one of them"),
    (["--config", "/nonexistent/config.json"], "does not exist"),
    (["--devices", "0,0"], "a device is named twice in '0,0'"),
    (["--devices", "0,,1"], "expected comma-separated device ids such as 0,1,2,3"),
    (["--devices", "0,1"], "--devices spreads cells over GPUs; the run's device is cpu"),
])
def test_bad_grid_input_exits_2_with_a_clear_message(args, message, tmp_path):
    result = _run([*TINY, *args, "--out", str(tmp_path / "never")])
    assert result.exit_code == 2, result.output
    assert message in _plain(result.output)
    assert not (tmp_path / "never" / "results.jsonl").exists()


def test_cuda_without_a_gpu_is_bad_input(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    result = _run(["grid", "--device", "cuda", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "no CUDA device is visible" in " ".join(result.stderr.split())


def test_invalid_config_file_is_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 64, "vocab_size": 100, "num_hidden_layers": 1, "num_attention_heads": 2, '
                   '"ffn_factor": 2, "hiden": 3}')
    result = _run([*TINY, "--config", str(bad), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "unknown field(s) hiden" in " ".join(result.stderr.split())


def overscaled_loss(hidden, weight, target, bias=None):
    """A deliberately wrong user loss: 1.5× cross-entropy, so loss and gradients are 50% off."""
    import torch.nn.functional as F

    return 1.5 * F.cross_entropy(F.linear(hidden, weight, bias).float(), target)


def test_grid_exits_1_when_a_back_end_fails_parity(tmp_path):
    out = tmp_path / "run"
    result = _run([*TINY, "--tokens", "16", "--backend", "torch", "--backend", f"{__name__}:overscaled_loss",
                   "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert f"PARITY FAILURE: {__name__}:overscaled_loss" in _plain(result.stdout)
    assert "A parity check failed its tolerance: exit code 1." in _plain(result.stdout)


@pytest.mark.parametrize("args, message", [
    (["grid", "--tokens", "0", "--device", "cpu"], "error: Invalid value for --tokens: '0' must be positive "
                                                   "(see fusedce-profile grid --help)"),
    (["explain", "--bogus"], "error: No such option: --bogus"),
    (["nosuch"], "error: No such command 'nosuch'. (see fusedce-profile --help)"),
])
def test_a_refusal_of_the_command_line_itself_is_one_line_too(args, message):
    """Values the option's type refuses, unknown options and commands were Click's four lines
    ("Usage: …", "Try …", a blank, "Error: …") where the tool's own checks print one."""
    from processes import cli_env, run_cli

    result = run_cli(args, cli_env())
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_back_end_that_cannot_take_the_four_arguments_is_refused_before_any_cell(tmp_path, monkeypatch):
    """``def loss(x)`` as a --backend ran, failed in every cell and exited 1, after the measuring."""
    (tmp_path / "wrongsig.py").write_text("def loss(x):\n    return x.sum()\n\n"
                                          "def fine(hidden, weight, target, bias=None, **options):\n"
                                          "    return (hidden @ weight.T).logsumexp(-1).mean()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "never"
    result = _run([*TINY, "--tokens", "8", "--backend", "wrongsig:loss", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "--backend wrongsig:loss: cannot be called as loss(hidden, weight, target, bias)" in _plain(result.output)
    assert not out.exists()
    from fusedce_profiler.instrument.backends.user import UserBackend

    assert UserBackend("wrongsig:fine").signature_problem() is None


def test_a_resume_with_other_options_is_refused_before_it_replaces_the_unfinished_plan(tmp_path):
    out = tmp_path / "run"
    assert _run([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)]).exit_code == 0
    plan = json.loads((out / "plan.json").read_text())
    unfinished = {**plan["cells"][0], "tokens": 16}  # as a run stopped before its second cell leaves it
    (out / "plan.json").write_text(json.dumps({"cells": plan["cells"] + [unfinished]}))
    other = _run(["grid", "--device", "cpu", "--resume", "--out", str(out)])  # the default grid's options
    assert other.exit_code == 2, other.output
    assert ("holds a run planned with other cells (1 unfinished of its 2 are not in this command's grid, e.g. "
            "torch at 16 tokens (H=32 V=256") in " ".join(_plain(other.output).split())
    assert len(json.loads((out / "plan.json").read_text())["cells"]) == 2  # the plan is kept
    same = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--resume", "--out", str(out)])
    assert same.exit_code == 0, same.output
    assert sorted(row.spec.tokens for row in _rows(out)) == [8, 16]


def test_a_resume_of_a_folder_whose_plan_cannot_be_read_is_refused_until_that_file_is_removed(tmp_path):
    """What the first run set out to measure is unknown: replacing its plan silently would let a resume
    with other options leave that run unfinished, unnoticed."""
    out = tmp_path / "run"
    assert _run([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)]).exit_code == 0
    (out / "plan.json").write_text('{"cells": 7}')
    refused = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--resume", "--out", str(out)])
    assert refused.exit_code == 2, refused.output
    assert (f"--resume: {out / 'plan.json'}: not a plan of cells (expected an object with a list of cells); remove "
            "that file to resume with this command's grid") in " ".join(_plain(refused.output).split())
    assert (out / "plan.json").read_text() == '{"cells": 7}'
    (out / "plan.json").unlink()
    again = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--resume", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert sorted(row.spec.tokens for row in _rows(out)) == [8, 16]


def test_a_resume_that_would_time_cells_otherwise_than_the_finished_ones_is_refused(tmp_path):
    """Warm-up and repeats are stored with the plan (no row says them): a resume with others would put
    cells timed two ways in one table."""
    out = tmp_path / "run"
    assert _run([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)]).exit_code == 0
    assert json.loads((out / "plan.json").read_text())["settings"] == {"warmup": 1, "repeats": 1}
    other = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--repeats", "3", "--resume", "--out", str(out)])
    assert other.exit_code == 2, other.output
    assert (f"--resume: the cells in {out} were timed with other settings (repeats 1, now 3); give the --warmup "
            "and --repeats of the command that started it") in " ".join(_plain(other.output).split())
    assert len(_rows(out)) == 1
    (out / "plan.json").unlink()  # the repeats are still told by the finished row's own times
    again = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--repeats", "3", "--resume", "--out", str(out)])
    assert again.exit_code == 2 and "(repeats 1, now 3)" in " ".join(_plain(again.output).split()), again.output
    same = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--resume", "--out", str(out)])
    assert same.exit_code == 0, same.output
    assert json.loads((out / "plan.json").read_text())["settings"] == {"repeats": 1}  # the warm-up is unknown now


def test_a_resume_whose_results_cannot_be_appended_to_leaves_the_plan_as_it_was(tmp_path):
    """The results file is checked before the plan is replaced: a refused append (here a hard link)
    left a plan of the new command's cells, and the folder read as another, cut, run."""
    import os

    out = tmp_path / "run"
    assert _run([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)]).exit_code == 0
    plan = (out / "plan.json").read_text()
    os.link(out / "results.jsonl", tmp_path / "elsewhere.jsonl")
    refused = _run([*TINY, "--tokens", "8,16", "--backend", "torch", "--resume", "--out", str(out)])
    assert refused.exit_code == 2 and "results.jsonl" in refused.output, refused.output
    assert (out / "plan.json").read_text() == plan
