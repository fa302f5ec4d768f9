"""Mistakes on the command line: each gets one line naming the argument and the fix, exit code 2,
before anything is measured or allocated — never a traceback."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fusedce_cli.app import app
from processes import cli_env, run_cli

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
TINY = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--repeats", "1", "--tokens", "8"]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")


def _invoke(args, **kwargs):
    return CliRunner().invoke(app, args, **kwargs)


def _plain(text: str) -> str:
    return " ".join(text.split())


def _bad(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_losses.py").write_text(
        "import torch.nn.functional as F\n\n"
        "def my_loss(hidden, weight, target, bias=None):\n"
        "    return F.cross_entropy(F.linear(hidden, weight, bias), target)\n\n"
        "def wrapper(model, input_ids, labels):\n"
        "    return model.logits(model(input_ids)).sum() * 0\n")
    (folder / "broken_losses.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(folder))
    return folder


# --- 11. back-ends resolved before any cell runs ------------------------------------------------

@pytest.mark.parametrize("command", [
    TINY,
    ["model", "--device", "cpu", "--preset", "tiny"],
    ["parity", "--device", "cpu", "--preset", "tiny"],
])
def test_a_backend_that_is_not_installed_says_how_to_install_it(command, tmp_path):
    if importlib.util.find_spec("liger_kernel"):
        pytest.skip("liger-kernel is installed here")
    result = _invoke([*command, "--backend", "liger", "--out", str(tmp_path / "never")])
    _bad(result, "--backend liger: not installed", 'pip install "fusedce[liger]"')
    assert not (tmp_path / "never").exists()


def test_model_takes_the_whole_model_liger_back_end_by_name(tmp_path):
    if importlib.util.find_spec("liger_kernel"):
        pytest.skip("liger-kernel is installed here")
    result = _invoke(["model", "--device", "cpu", "--preset", "tiny", "--backend", "liger-patched",
                      "--out", str(tmp_path / "never")])
    _bad(result, "--backend liger-patched: not installed", 'pip install "fusedce[liger]"')


@pytest.mark.parametrize("backend, fragments", [
    ("no_such_module:loss", ("--backend no_such_module:loss: no module named 'no_such_module' on Python's path",
                             "put the folder that holds it on PYTHONPATH", "the current folder")),
    ("my_losses:my_los", ("--backend my_losses:my_los:", "has no attribute 'my_los'", "did you mean 'my_loss'")),
    ("broken_losses:loss", ("importing 'broken_losses' failed: ModuleNotFoundError: No module named "
                            "'not_a_module_anywhere'",)),
])
def test_a_user_backend_that_cannot_be_resolved_exits_2_before_any_cell(backend, fragments, user_module, tmp_path):
    out = tmp_path / "never"
    _bad(_invoke([*TINY, "--backend", "torch", "--backend", backend, "--out", str(out)]), *fragments)
    assert not out.exists()  # nothing measured, no folder made


def test_parity_and_model_resolve_user_backends_up_front(user_module, tmp_path):
    for command in (["model", "--device", "cpu", "--preset", "tiny"], ["parity", "--device", "cpu", "--preset", "tiny"]):
        _bad(_invoke([*command, "--backend", "my_losses:nope", "--out", str(tmp_path / "never")]),
             "has no attribute 'nope'")


def test_doctor_resolves_its_loss_up_front(user_module):
    _bad(_invoke(["doctor", "--loss", "my_losses:wraper"]), "--loss my_losses:wraper:", "did you mean 'wrapper'")
    _bad(_invoke(["doctor", "--loss", "nowhere_module:fn"]), "no module named 'nowhere_module'")


def test_the_console_script_imports_a_backend_from_the_current_folder(user_module, tmp_path):
    """``fusedce-profile`` (not ``python -m``) finds ``my_losses.py`` in the folder it runs in."""
    out = tmp_path / "run"
    result = run_cli([*TINY, "--backend", "my_losses:my_loss", "--out", str(out)], cli_env(), cwd=user_module,
                     script=True)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["spec"]["backend"], r["status"]) for r in rows] == [("my_losses:my_loss", "ok")]


# --- 13. devices ----------------------------------------------------------------------------------

@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
@pytest.mark.parametrize("command", [
    [], ["grid", "--tokens", "8"], ["model", "--preset", "tiny"], ["parity", "--preset", "tiny"],
    ["doctor", "--preset", "tiny", "--loss", "examples.doctor_losses:fused_loss"],
])
def test_cuda_without_a_gpu_says_use_cpu_in_every_command(command, device, tmp_path):
    _bad(_invoke([*command, "--device", device, "--out", str(tmp_path / "never")]),
         f"--device {device}: no CUDA device is visible", "use --device cpu")


@pytest.mark.parametrize("command", [[], ["grid"], ["model"], ["parity"],
                                     ["doctor", "--loss", "examples.doctor_losses:fused_loss"]])
def test_device_gpu_is_told_to_use_cuda_or_cpu(command, tmp_path):
    _bad(_invoke([*command, "--device", "gpu", "--out", str(tmp_path / "never")]),
         "--device gpu: not a device name; use cuda (or cuda:K) or cpu")


# --- 14. a model too large for the device --------------------------------------------------------

def test_model_refuses_a_model_that_cannot_fit_before_building_it(tmp_path, monkeypatch):
    import fusedce_profile.checks

    monkeypatch.setattr(fusedce_profile.checks, "device_memory_bytes", lambda device: 64 << 30)
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    shutil.copy(CONFIGS / "llama-3-8b.config.json", folder / "config.json")
    built = []
    monkeypatch.setattr("fusedce_profiler.instrument.models.gpt.GPT.__init__", lambda *a, **k: built.append(1))
    result = _invoke(["model", "--config", str(folder), "--device", "cpu", "--out", str(tmp_path / "never")])
    _bad(result, "llama (8.03 B parameters) needs at least 120 GiB to train on cpu",
         "weights, gradients and AdamW state 120 GiB, 16 bytes per parameter", "activations at B=4 T=64",
         "more than this machine's physical memory, 64.0 GiB")
    assert not built and not (tmp_path / "never").exists()
    _bad(_invoke(["parity", "--config", str(folder), "--device", "cpu", "--out", str(tmp_path / "never")]),
         "needs at least 120 GiB")


def test_device_memory_of_the_cpu_is_its_physical_memory():
    import os

    from fusedce_profile.checks import device_memory_bytes

    assert device_memory_bytes("cpu") == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_model_run_where_every_job_fails_exits_1(tmp_path, monkeypatch):
    import fusedce_profiler.instrument.step.jobs as jobs

    def fails(job, log_dir, timeout_s=900):
        return jobs.ModelResult(job=job, status="error", message="RuntimeError: " + "word " * 60)

    monkeypatch.setattr(jobs, "run_job_in_worker", fails)
    result = _invoke(["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8",
                      "--backend", "torch", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "every job failed" in result.stdout
    shown = _plain(result.stdout).split("torch: error: ")[1]
    assert shown.startswith("RuntimeError: word word") and " word… " in shown  # cut at a word boundary
    stored = json.loads((tmp_path / "run" / "model_results.jsonl").read_text().splitlines()[0])
    assert stored["message"].count("word") == 60  # stored whole


# --- 15. --config: a model folder, a file that is not UTF-8 -------------------------------------

def test_config_may_name_a_model_folder(tmp_path):
    folder = tmp_path / "gemma"
    folder.mkdir()
    shutil.copy(CONFIGS / "gemma-2-2b.config.json", folder / "config.json")
    result = _invoke([*TINY[:-2], "--config", str(folder), "--tokens", "8", "--backend", "torch", "--vocab", "256",
                      "--hidden", "32", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output


def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"hidden_size": 64, "name": "\xff\xfe"}')
    _bad(_invoke([*TINY, "--config", str(bad), "--out", str(tmp_path / "x")]), f"{bad}: not UTF-8 text")
    _bad(_invoke([*TINY, "--config", str(tmp_path), "--out", str(tmp_path / "x")]), f"{bad}: not UTF-8 text")
    empty = tmp_path / "empty"
    empty.mkdir()
    _bad(_invoke([*TINY, "--config", str(empty), "--out", str(tmp_path / "x")]), "has no config.json")


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_config_with_an_integer_python_cannot_convert_names_the_file(tmp_path, suffix):
    """An integer of 5,000 digits: Python's own conversion message named neither --config nor the file."""
    bad = tmp_path / f"config{suffix}"
    digits = "9" * 5000
    bad.write_text(f'{{"hidden_size": {digits}}}' if suffix == ".json" else f"hidden_size = {digits}\n")
    _bad(_invoke([*TINY, "--config", str(bad), "--out", str(tmp_path / "x")]), f"{bad}: ")


# --- 18. help and wording -------------------------------------------------------------------------

def test_help_shows_flags_without_a_value_and_every_exit_code():
    top = _invoke(["--help"]).stdout
    grid = _invoke(["grid", "--help"]).stdout
    model = _invoke(["model", "--help"]).stdout
    for text in (top, grid, model):
        assert "<bool>" not in text
    assert "--force " in grid and "--backend NAME" in grid and "--tied / --untied" in model
    flat = _plain(top)
    assert "130 interrupted by Ctrl-C, 143 by SIGTERM" in flat and "2 bad usage or input" in flat
    assert "exit 1 on divergence." in flat  # command descriptions are not cut short


def test_one_cell_is_one_cell(tmp_path):
    result = _invoke([*TINY, "--backend", "torch", "--out", str(tmp_path / "run")])
    assert "fusedce-profile grid: 1 cell, writing to" in result.stdout


def test_a_tiny_negative_percentage_is_zero():
    from fusedce_reports.units import format_percent

    assert format_percent(-0.0004) == "0%" and format_percent(-0.006) == "-1%" and format_percent(0.943) == "94%"


@pytest.mark.parametrize("columns", ["80", "100"])
def test_backends_table_keeps_its_options_column_on_a_narrow_terminal(columns):
    result = _invoke(["backends"], env={"COLUMNS": columns})
    assert result.exit_code == 0
    assert "smoothing" in result.stdout and "options" in result.stdout
    assert all(len(line) <= int(columns) for line in result.stdout.splitlines())
    if importlib.util.find_spec("liger_kernel") is None:
        assert "fusedce[liger]" in result.stdout and 'liger: pip install "fusedce[liger]"' in result.stdout


@pytest.mark.parametrize("extra, fragment", [
    (["--seq-candidates", "32,x"], "Invalid value for --seq-candidates: 'x' is not a positive integer"),
    (["--calibration-batches", "1,a"], "Invalid value for --calibration-batches: 'a' is not a positive integer"),
    (["--calibration-batches", "2,2"], "error: --calibration-batches needs at least two different positive batch sizes"),
    (["--naive", "-3"], "error: --naive -3.0: expected a finite number > 0"),
    (["--context-mib", "5"], "error: --context-mib must be positive and below both readings"),
])
def test_explain_names_the_option_of_a_bad_value(extra, fragment, tmp_path):
    argv = ["explain", "--device", "cpu", "--preset", "tiny", "--naive", "3", "--fused", "2", "--card", "24",
            "--seq", "32", "--out", str(tmp_path / "never")]
    result = _invoke(argv + extra)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert fragment in " ".join(_plain(result.output).split()), result.output
    assert not (tmp_path / "never").exists()
