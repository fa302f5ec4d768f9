"""A signal after the last result was stored, while the report is written: every result is kept,
the line says so and how to write the report, and the exit code is the signal's — never the claim
that nothing was kept, never a report that looks whole when it is not."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile.signals import Terminated

pytestmark = pytest.mark.faults

TINY_GRID = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--tokens", "8", "--repeats", "1",
             "--warmup", "0", "--backend", "torch"]


def _terminated(*args, **kwargs):
    raise Terminated()


def test_a_signal_while_a_whole_grids_report_is_written_keeps_every_cell_and_says_how_to_write_it(
        tmp_path, monkeypatch):
    monkeypatch.setattr("fusedce_profile.grid_run.build_report", _terminated)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY_GRID, "--out", str(out)])
    assert result.exit_code == 143, result.output
    said = " ".join(result.output.split())
    assert (f"Stopped by SIGTERM while the report was written; every result is kept (1 cell); write the report "
            f"with `fusedce-profile report {out}`") in said
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    assert not (out / "summary.md").exists()  # no page that would look whole
    monkeypatch.undo()
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0  # the hint works
    assert (out / "summary.md").is_file()


def test_a_signal_as_a_whole_grids_report_is_printed_says_the_report_is_whole(tmp_path, monkeypatch):
    monkeypatch.setattr("fusedce_profile.grid_run.print_report", _terminated)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY_GRID, "--out", str(out)])
    assert result.exit_code == 143, result.output
    said = " ".join(result.output.split())
    assert "Stopped by SIGTERM as the report was printed; its files are whole" in said
    assert "while the report was written" not in said
    assert (out / "summary.md").is_file()


def test_a_signal_while_a_whole_model_runs_report_is_written_keeps_every_job(tmp_path, monkeypatch):
    monkeypatch.setattr("fusedce_reports.model_report.write_model_report", _terminated)
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["model", "--preset", "tiny", "--device", "cpu", "--batch", "2", "--seq", "8",
                                      "--no-trace", "--backend", "torch", "--out", str(out)])
    assert result.exit_code == 143, result.output
    assert "Stopped by SIGTERM while the report was written; every result is kept (1 job)" in \
        " ".join(result.output.split())
    rows = [json.loads(line) for line in (out / "model_results.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == ["ok"]


def test_a_stop_that_reaches_the_command_line_names_the_folder_it_held(monkeypatch, tmp_path):
    from fusedce_cli.ending import _what_was_kept
    from fusedce_profiler.instrument.runlock import RunLock

    monkeypatch.setattr(RunLock, "taken", [])
    assert _what_was_kept() == "before the command had anything to keep"
    with RunLock(tmp_path / "held"):
        pass
    assert RunLock.taken == [tmp_path / "held"]
    (tmp_path / "held" / "results.jsonl").write_text("{}\n")  # a result had finished
    assert _what_was_kept() == (f"in {tmp_path / 'held'}: what had finished is kept there; "
                                f"`fusedce-profile report {tmp_path / 'held'}` writes its report; "
                                f"continue with the same command and --resume --out {tmp_path / 'held'}")
    (tmp_path / "held" / "results.jsonl").unlink()
    (tmp_path / "held" / "doctor.json").write_text("{}")  # doctor has no --resume
    assert _what_was_kept().endswith("writes its report")


def test_a_stopped_doctor_says_what_its_folder_holds(tmp_path):
    """Stopped before any check ran, with a partial report, or after every check was stored: three
    different lines, each true of the folder (a stop after the checks were stored had said
    "partial report (no verdict)" of a complete one)."""
    from fusedce_profile.doctor import what_the_stop_left
    from fusedce_profiler.instrument import store
    from fusedce_profiler.judgements.doctor.records import DoctorRun

    assert what_the_stop_left(tmp_path, Terminated()).startswith("interrupted before any check ran; nothing to report")
    run = DoctorRun(loss="m:f", config="tiny", checks=[], interrupted=True)
    store.write_json(tmp_path / store.DOCTOR_FILE, run.to_dict())
    assert what_the_stop_left(tmp_path, Terminated()).startswith("interrupted; partial report (no verdict)")
    run.interrupted = False
    store.write_json(tmp_path / store.DOCTOR_FILE, run.to_dict())
    said = what_the_stop_left(tmp_path, Terminated())
    assert said.startswith("stopped by SIGTERM after every check finished: ") and said.endswith(
        f"report: {tmp_path / 'summary.md'}")


def test_a_stop_in_a_folder_that_holds_no_result_yet_does_not_point_at_a_report(tmp_path, monkeypatch):
    """A signal right after a command took its folder said "what had finished is kept there;
    `report DIR` writes its report" of an empty folder that report refuses."""
    from fusedce_cli.ending import _what_was_kept
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.runlock import RunLock

    monkeypatch.setattr(RunLock, "taken", [tmp_path])
    assert _what_was_kept() == f"in {tmp_path} before anything had finished; run the command again"
    (tmp_path / store.MODEL_RESULTS_FILE).write_text("{}\n")
    assert f"`fusedce-profile report {tmp_path}` writes its report; continue with the same command and --resume" \
        in _what_was_kept()


LEAVING = """
import os, signal, sys, threading, time
import fusedce_cli.app, fusedce_cli.ending, fusedce_reports.matplotlib_folders as folders
from fusedce_profile.signals import raise_terminated
signal.signal(signal.SIGTERM, raise_terminated)   # as a started command has it
def command():
    {command}
fusedce_cli.app.app = command
import matplotlib  # the exit path cleans up matplotlib's folders when it was loaded
def slow_cleanup(named):  # the signal lands while the command line leaves
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
folders.discard_temporary_config = slow_cleanup
fusedce_cli.ending.main()
"""


@pytest.mark.parametrize("command, code", [("raise SystemExit(1)", 1), ("return None", 0)])
def test_a_signal_after_the_command_ended_changes_neither_its_code_nor_prints_a_traceback(command, code):
    import subprocess
    import sys

    left = subprocess.run([sys.executable, "-c", LEAVING.format(command=command)], capture_output=True, text=True,
                          timeout=120)
    assert left.returncode == code, left.stderr
    assert left.stderr == ""


def test_a_signal_as_the_command_returns_is_one_line_and_its_code():
    import subprocess
    import sys

    # the command's own SIGTERM handler raises as it returns: outside every handling of the command
    raising = LEAVING.format(command="os.kill(os.getpid(), signal.SIGTERM)").replace(
        "def slow_cleanup(named):", "def slow_cleanup(named):\n    return")
    left = subprocess.run([sys.executable, "-c", raising], capture_output=True, text=True, timeout=120)
    assert left.returncode == 143, left.stderr
    assert left.stderr == ("fusedce-profile: stopped by SIGTERM as the command ended before the command had "
                           "anything to keep\n")
