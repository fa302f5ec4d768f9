"""User code cannot end ``doctor``: the loss wrapper and the model factory run in a worker with a
time limit and a memory guard. An exception that is no evidence, ``sys.exit`` with any code, a hang
or runaway memory is one line naming the callable and exit 1 — never exit 0; a signature doctor
cannot call is exit 2; SIGTERM leaves a report marked interrupted and exits 143. Without ``--out``
the run folder is the default one ``--help`` names, and the same command gives the same record.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.processes import cli_env, kill_group, run_cli, start_cli, wait_for

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

MODEL = ["--model", "tests.doctor_models:untied", "--device", "cpu", "--compile-backend", "none"]


@pytest.fixture
def doctor(tmp_path, monkeypatch):
    """``fusedce-profile doctor ARGS`` run from ``tmp_path`` in this process (the loss and the factory
    run in doctor's worker either way; a second interpreter would only add its start-up)."""
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess:
        result = CliRunner().invoke(app, ["doctor", *args])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        return subprocess.CompletedProcess(["doctor", *args], result.exit_code, result.stdout, result.stderr)

    return run


def _lines(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


@pytest.mark.parametrize("loss, said", [
    ("tests.doctor_wrappers:exits_zero", "called sys.exit(0)"),
    ("tests.doctor_wrappers:exits_seven", "called sys.exit(7)"),
])
def test_a_loss_that_exits_gives_one_line_naming_it_and_exit_1(doctor, tmp_path, loss, said):
    result = doctor(*MODEL, "--loss", loss, "--out", str(tmp_path / "d"))
    assert result.returncode == 1, result
    last = _lines(result)[-1]
    assert f"--loss {loss}" in last and said in last and "Traceback" not in result.stdout + result.stderr


def test_a_loss_whose_exception_cannot_be_printed_is_still_one_line_naming_it(doctor, tmp_path):
    """Its ``__str__`` raises: the line says so, naming the loss and what it raised (it was a traceback
    of doctor's own error handling)."""
    loss = "tests.doctor_wrappers:raises_unprintable"
    result = doctor(*MODEL, "--loss", loss, "--out", str(tmp_path / "d"))
    assert result.returncode == 1, result
    last = _lines(result)[-1]
    assert f"--loss {loss}" in last and "Unprintable: <its message could not be formed" in last, last
    assert "Traceback" not in result.stdout + result.stderr


def test_a_loss_that_hangs_is_stopped_at_the_time_limit(doctor, tmp_path):
    loss = "tests.doctor_wrappers:hangs"
    # the limit bounds the factory too: 8 s lets it build the model on a loaded two-core machine (3 s did not)
    result = doctor(*MODEL, "--loss", loss, "--timeout", "8", "--out", str(tmp_path / "d"))
    assert result.returncode == 1, result
    assert f"--loss {loss}" in _lines(result)[-1] and "did not finish within 8 s" in _lines(result)[-1]


def test_a_loss_that_allocates_without_end_is_stopped_by_the_memory_guard(doctor, tmp_path):
    loss = "tests.doctor_wrappers:allocates"
    # 1 GiB: above what the worker holds before the loss runs (torch and the model), reached in a few
    # of the loss's 256 MiB steps
    result = doctor(*MODEL, "--loss", loss, "--memory-limit", "1", "--out", str(tmp_path / "d"))
    assert result.returncode == 1, result
    assert f"--loss {loss}" in _lines(result)[-1] and "memory limit of 1 GiB" in _lines(result)[-1]


@pytest.mark.parametrize("factory, said", [("tests.doctor_models:factory_raises", "RuntimeError: the factory's own bug"),
                                           ("tests.doctor_models:factory_exits", "called sys.exit(0)"),
                                           ("tests.doctor_models:exits_on_meta", "called sys.exit(0)")])
def test_a_factory_that_fails_gives_one_line_naming_it_and_exit_1(doctor, tmp_path, factory, said):
    result = doctor("--model", factory, "--loss", "tests.doctor_wrappers:correct", "--device", "cpu",
                     "--out", str(tmp_path / "d"))
    assert result.returncode == 1, result
    assert f"--model {factory}" in _lines(result)[-1] and said in _lines(result)[-1]
    assert _lines(result)[-1].count("--model") == 1 and "FactoryRaised" not in _lines(result)[-1]  # named once


def test_the_factory_runs_once_in_each_process_that_needs_it(doctor, tmp_path, monkeypatch):
    """Its shapes are read in a worker of their own, the checks run in another: two calls, one each,
    none in the command's process."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("FUSEDCE_TEST_FACTORY_CALLS", str(calls))
    result = doctor("--model", "tests.doctor_models:counted", "--device", "cpu", "--compile-backend", "none",
                    "--loss", "tests.doctor_wrappers:correct", "--out", str(tmp_path / "d"))
    assert result.returncode == 0, result
    pids = calls.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2 and str(os.getpid()) not in pids, pids


@pytest.mark.parametrize("loss, said", [("returns_int", "got int"), ("returns_vector", "got Tensor of shape (4,)")])
def test_a_loss_that_returns_no_scalar_fails_the_check_saying_what_it_returned(doctor, tmp_path, loss, said):
    result = doctor(*MODEL, "--loss", f"tests.doctor_wrappers:{loss}", "--out", str(tmp_path / "d"))
    assert result.returncode == 1 and result.stdout.splitlines()[-1].startswith("doctor: FAIL"), result
    check = next(line for line in result.stdout.splitlines() if "the loss must return a scalar tensor" in line)
    assert check.endswith(said), check


def test_a_page_that_cannot_be_written_keeps_the_checks_and_says_how_to_write_it(doctor, tmp_path, monkeypatch):
    """A full disk at ``summary.md``: one line naming the page, that the checks are kept, and the
    command that writes the page once that is mended; ``doctor.json`` stays."""
    import errno

    import fusedce_reports.doctor_report as pages

    out = tmp_path / "d"

    def full_disk(folder):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "summary.md"))

    monkeypatch.setattr(pages, "write_doctor_report", full_disk)
    result = doctor(*MODEL, "--loss", "tests.doctor_wrappers:correct", "--out", str(out))
    assert result.returncode == 2, result
    said = " ".join(_lines(result)[-1].split())
    assert f"{out}/summary.md: No space left on device; the checks are kept in {out}: " \
           f"`fusedce-profile report {out}` writes the report once that is mended" in said, said
    assert json.loads((out / "doctor.json").read_text())["checks"]


def test_a_loss_doctor_cannot_call_is_exit_2_in_one_line(doctor, tmp_path):
    result = doctor(*MODEL, "--loss", "tests.doctor_wrappers:four_required", "--out", str(tmp_path / "d"))
    assert result.returncode == 2, result
    assert len(_lines(result)) == 1 and "fn(model, batch) or fn(model, input_ids, labels)" in _lines(result)[0]


def test_without_out_the_default_folder_is_written_and_the_same_command_gives_the_same_record(doctor, tmp_path):
    args = [*MODEL, "--loss", "tests.doctor_wrappers:correct"]
    first, second = doctor(*args), doctor(*args)
    assert first.returncode == second.returncode == 0, first
    folders = sorted(tmp_path.glob("fusedce-profile-*"))
    assert len(folders) == 2 and all((f / "summary.md").is_file() for f in folders)
    records = [json.loads((f / "doctor.json").read_text()) for f in folders]
    assert records[0] == records[1] and records[0]["checks"]


def test_sigterm_leaves_a_report_marked_interrupted_and_exits_143(tmp_path):
    out = tmp_path / "d"
    process = start_cli(["doctor", *MODEL, "--loss", "tests.doctor_wrappers:hangs", "--out", str(out)], cli_env(),
                        cwd=tmp_path)
    try:
        wait_for(lambda: any("--- job doctor" in log.read_text() for log in (out / "logs").glob("worker-*.log")), 120,
                 "the worker to start the job", process)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            kill_group(process)
    assert process.returncode == 143, stdout + stderr
    assert "interrupted" in stdout + stderr
    assert "run the same command with --force" in stdout
    record = json.loads((out / "doctor.json").read_text())
    assert record["interrupted"] is True and record["checks"] == []
    assert (out / "summary.md").read_text().startswith("# fusedce-profile doctor: INTERRUPTED")
    rebuilt = run_cli(["report", str(out)], cli_env())  # said "doctor: FAIL" and exited 1 where the page says no verdict
    assert rebuilt.returncode == 0 and "doctor: FAIL" not in rebuilt.stdout, rebuilt.stdout + rebuilt.stderr
    assert "interrupted before its verdict (no verdict)" in rebuilt.stdout
    from fusedce_profile.folders import prepare_out_dir  # the hint, typed as printed, is not refused

    assert prepare_out_dir(out, force=True, resume=False, resume_option=False) == out
