"""A user back-end's own code never runs in the command's process, and never ends a run.

Checking a ``--backend module:callable`` imports its module and, for a class, makes an instance:
that happens in a worker (``fusedce_profiler.instrument.backends.check``), so a module that calls
``sys.exit``, ``os._exit`` or ``argparse`` at its top level, hangs or allocates is one line naming
it (exit 1), and a back-end that writes to the worker's reply pipe or raises a message of megabytes
is one failed cell of a run that goes on. Also: the hints a refusal prints work as printed, and
Ctrl-C while the command line is being built is one line.
"""
from __future__ import annotations

import json
import signal
import textwrap

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument.store import RESULTS_FILE
from fusedce_profiler.instrument.text import MAX_STORED_CHARS

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

TINY = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--tokens", "8", "--repeats", "1",
        "--warmup", "0"]
OK = "def ok(hidden, weight, target, bias=None):\n    import torch.nn.functional as F\n" \
     "    return F.cross_entropy(F.linear(hidden, weight, bias), target)\n"
MODULES = {
    "uc_exit0": "import sys\nsys.exit(0)\n" + OK,
    "uc_exit3": "import sys\nsys.exit(3)\n" + OK,
    "uc_osexit": "import os\nos._exit(0)\n" + OK,
    "uc_argparse": "import argparse\nargparse.ArgumentParser().parse_args()\n" + OK,
    "uc_hang": "import time\nwhile True:\n    time.sleep(1)\n" + OK,
    "uc_backends": OK + textwrap.dedent('''
        import json, os, sys

        class ExitClass:
            def __init__(self):
                sys.exit(0)

            def __call__(self, hidden, weight, target, bias=None):
                return ok(hidden, weight, target, bias)

        def wrong(hidden):
            return hidden.sum()

        def interrupts(hidden, weight, target, bias=None):
            raise KeyboardInterrupt("from the back-end")

        def big(hidden, weight, target, bias=None):
            raise RuntimeError("M" * (5 << 20))  # over the 4 MiB a results line may hold

        def surrogate(hidden, weight, target, bias=None):  # what surrogateescape makes of a non-UTF-8 byte
            raise RuntimeError("lone \\udc80 surrogate \\ud800 here")

        def flood(hidden, weight, target, bias=None):  # bytes without a line end, to every pipe, without end
            block = b"x" * 65536
            while True:
                for fd in range(3, 64):
                    try:
                        os.write(fd, block)
                    except OSError:
                        pass

        def _request():  # the job the worker is serving, read off its stack
            frame = sys._getframe()
            while frame is not None and not isinstance(frame.f_locals.get("request"), dict):
                frame = frame.f_back
            return frame.f_locals["request"]

        def _forge(reply):  # a reply of its own, with the job's token, to every pipe
            line = json.dumps({"ok": True, "reply": reply, "id": _request()["id"]}) + "\\n"
            for fd in range(3, 64):
                try:
                    os.write(fd, line.encode())
                except OSError:
                    pass

        def forged_text(hidden, weight, target, bias=None):
            _forge("x")
            return ok(hidden, weight, target, bias)

        def forged_whole(hidden, weight, target, bias=None):  # a well-formed result of its own cell; the real follows
            _forge({"spec": _request()["payload"]["spec"], "status": "ok", "peak_step_bytes": 7, "time_ms": 1e-3})
            return ok(hidden, weight, target, bias)

        def forged_cell(hidden, weight, target, bias=None):  # a well-formed result of another cell
            _forge({"spec": {"backend": "torch", "tokens": 1, "vocab": 2, "hidden": 3}, "status": "error", "message": "m"})
            return ok(hidden, weight, target, bias)

        def garbage(hidden, weight, target, bias=None):  # writes to every pipe the worker holds
            for fd in range(3, 64):
                try:
                    os.write(fd, b"garbage\\n")
                except OSError:
                    pass
            return ok(hidden, weight, target, bias)
    '''),
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    folder = tmp_path / "modules"
    folder.mkdir()
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def _line(result) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("backend, says", [
    ("uc_exit0:ok", "--backend uc_exit0:ok: importing it called sys.exit(0)"),
    ("uc_exit3:ok", "--backend uc_exit3:ok: importing it called sys.exit(3)"),
    ("uc_argparse:ok", "--backend uc_argparse:ok: importing it called sys.exit(2)"),
    ("uc_osexit:ok", "--backend uc_osexit:ok: importing it ended the worker that checked it (the worker exited "
                     "with code 0"),
    ("uc_backends:ExitClass", "--backend uc_backends:ExitClass: making it (ExitClass()) called sys.exit(0)"),
])
@pytest.mark.parametrize("command", ["grid", "model"])
def test_a_module_that_ends_its_process_is_one_line_naming_it_and_exit_1(modules, tmp_path, command, backend, says):
    args = [*TINY] if command == "grid" else ["model", "--preset", "tiny", "--device", "cpu", "--batch", "2",
                                               "--seq", "8", "--no-trace"]
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*args, "--backend", "torch", "--backend", backend, "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert says in _line(result), result.stderr
    assert not out.exists()  # refused before the run folder is made
    assert "usage: fusedce-profile" not in result.output  # argparse's usage line is the module's, never shown


def test_a_module_that_hangs_at_import_is_stopped_at_the_check_time_limit(modules, tmp_path, monkeypatch):
    monkeypatch.setattr("fusedce_profiler.instrument.backends.check.CHECK_TIMEOUT_S", 3.0)
    result = CliRunner().invoke(app, [*TINY, "--backend", "uc_hang:ok", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "--backend uc_hang:ok: importing it did not finish within 3 s" in _line(result)


def test_a_wrong_signature_is_still_a_usage_error(modules, tmp_path):
    result = CliRunner().invoke(app, [*TINY, "--backend", "uc_backends:wrong", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "cannot be called as wrong(hidden, weight, target, bias)" in _line(result)


def test_a_message_of_megabytes_and_a_written_reply_pipe_are_failed_cells_of_a_run_that_goes_on(modules, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--backend", "torch", "--backend", "uc_backends:big", "--backend",
                                      "uc_backends:garbage", "--backend", "uc_backends:ok", "--out", str(out)])
    assert result.exit_code == 1, result.output  # two named back-ends failed in every cell
    rows = {row["spec"]["backend"]: row for row in map(json.loads, (out / RESULTS_FILE).read_text().splitlines())}
    assert rows["torch"]["status"] == rows["uc_backends:ok"]["status"] == "ok"
    big = rows["uc_backends:big"]
    assert big["status"] == "error" and len(big["message"]) < MAX_STORED_CHARS + 200
    assert "more characters not stored" in big["message"]
    garbage = rows["uc_backends:garbage"]
    assert garbage["status"] == "error"
    assert "the worker's reply pipe carried a line the tool did not write" in garbage["message"]
    assert (out / "summary.md").is_file()


def test_a_forged_reply_carrying_the_jobs_token_is_a_failed_cell_of_a_run_that_goes_on(modules, tmp_path):
    """A back-end can find the job's token (it runs in the worker); a reply of the wrong shape, or
    about another cell, is that cell's error, never a traceback or the end of the run."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--backend", "uc_backends:forged_text", "--backend",
                                      "uc_backends:forged_cell", "--backend", "uc_backends:forged_whole", "--backend",
                                      "torch", "--out", str(out)])
    assert result.exit_code == 1, result.output
    rows = {row["spec"]["backend"]: row for row in map(json.loads, (out / RESULTS_FILE).read_text().splitlines())}
    # a forged reply of the right shape about its own cell cannot be told from the real one (the back-end runs
    # where it is measured); the real reply that follows it is dropped, never taken as the next cell's
    assert rows["uc_backends:forged_whole"]["peak_step_bytes"] == 7
    assert rows["torch"]["status"] == "ok" and len(rows) == 4
    for name, why in [("forged_text", "a cell's result must be an object, got str"), ("forged_cell", "it is about another cell")]:
        row = rows[f"uc_backends:{name}"]
        assert row["status"] == "error"
        assert "the worker's reply to the cell job did not have its shape" in row["message"] and why in row["message"]
    assert (out / "summary.md").is_file()


def test_a_training_step_or_curve_reply_about_another_job_is_refused():
    import dataclasses

    from fusedce_profile.parity import _curve_of
    from fusedce_profiler.instrument.models.configs import ModelConfig
    from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
    from fusedce_profiler.judgements.parity import ParityCurve

    job = ModelJob(ModelConfig("m", 8, 16, 1, 2, 16), "uc:mine", 2, 4, device="cpu")
    other = dataclasses.replace(job, backend="torch", batch=99)
    reply = ModelResult(job=other, status="error", message="m").to_dict()
    with pytest.raises(ValueError, match=r"it is about another job \(torch, B=99, T=4\)"):
        ModelResult.answering(job, reply)
    assert ModelResult.answering(other, reply).job == other
    with pytest.raises(ValueError, match=r"the curve of another back-end \(torch\)"):
        _curve_of("uc:mine", ParityCurve("torch"))


def test_explain_checks_its_fused_backend_before_it_measures(modules, tmp_path):
    args = ["explain", "--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu", "--preset", "tiny",
            "--seq", "32", "--attention", "sdpa", "--untied", "--no-checkpointing", "--no-eval-step"]
    wrong = CliRunner().invoke(app, [*args, "--fused-backend", "uc_backends:wrong", "--out", str(tmp_path / "a")])
    assert wrong.exit_code == 2, wrong.output
    assert "--fused-backend uc_backends:wrong: cannot be called as wrong(" in _line(wrong)
    exits = CliRunner().invoke(app, [*args, "--fused-backend", "uc_exit0:ok", "--out", str(tmp_path / "b")])
    assert exits.exit_code == 1, exits.output
    assert "--fused-backend uc_exit0:ok: importing it called sys.exit(0)" in _line(exits)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_explain_with_a_fused_backend_that_fails_every_step_judges_nothing_and_exits_1(modules, tmp_path):
    """Reasoning on failed steps would be a claim about nothing measured: the failure is named,
    nothing is judged, exit 1 (--resume then runs the failed steps again: the next test)."""
    args = ["explain", "--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu", "--preset", "tiny",
            "--seq", "32", "--attention", "sdpa", "--untied", "--no-checkpointing", "--no-eval-step",
            "--fused-backend", "uc_fails:loss", "--out", str(tmp_path / "run")]
    (modules / "uc_fails.py").write_text("import sys\ndef loss(hidden, weight, target, bias=None):\n    sys.exit(3)\n")
    failed = CliRunner().invoke(app, args)
    assert failed.exit_code == 1, failed.output
    assert ("error: uc_fails:loss failed in every calibration step; the first: B=2: the worker exited with code 3; "
            "log logs/worker-") in _line(failed)
    explanation = json.loads((tmp_path / "run" / "explain.json").read_text())
    assert explanation["hypotheses"] == [] and explanation["others"] == [] and not explanation["decided"]
    page = (tmp_path / "run" / "summary.md").read_text()
    assert "## Failed calibration steps" in page and "uc_fails:loss failed in every one; the first, B=2: " in page


def test_resume_runs_a_failed_step_again_and_reuses_a_finished_one(tmp_path):
    from fusedce_profile.explain import StepStore
    from fusedce_profiler.instrument.models.configs import ModelConfig
    from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult

    job = ModelJob(ModelConfig("m", 8, 16, 1, 2, 16), "torch", 2, 4, device="cpu")
    steps = StepStore(tmp_path / "steps.jsonl", None, resume=False)
    steps.put("failed", ModelResult(job=job, status="error", message="exit 3"))
    steps.put("timed-out", ModelResult(job=job, status="timeout", message="900 s"))
    steps.put("oom", ModelResult(job=job, status="oom", message="out of memory"))
    again = StepStore(tmp_path / "steps.jsonl", None, resume=True)
    assert again.get("failed") is None and again.get("timed-out") is None  # their cause may be fixed
    assert again.get("oom").status == "oom"  # a result about the step, not a failure of it


@pytest.mark.parametrize("row", ['{"key": "a"}', '{"key": "a", "result": {}}', '{"key": [1], "result": null}'])
def test_a_steps_file_with_a_row_this_command_did_not_write_is_one_line(tmp_path, row):
    cache = tmp_path / "cache.jsonl"
    cache.write_text(row + "\n")
    result = CliRunner().invoke(app, ["explain", "--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu",
                                      "--preset", "tiny", "--seq", "32", "--attention", "sdpa", "--untied",
                                      "--no-checkpointing", "--no-eval-step", "--cache", str(cache),
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert f"--cache: {cache}:1: not a valid row" in _line(result)
    assert "Traceback" not in result.output


def test_an_empty_out_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*TINY, "--backend", "torch", "--out", ""])
    assert result.exit_code == 2, result.output
    assert "an empty folder name" in _line(result)
    assert list(tmp_path.iterdir()) == []


def test_out_is_text_until_its_check_whatever_typer_converts():
    """A typer that converts the value before the option's check (as one on the GPU machine did) passed it
    a ``Path``: ``'PosixPath' object has no attribute 'strip'``, a traceback for every ``--out``. The option is
    declared as text now, and the check takes either."""
    import typing

    from pathlib import Path

    from typer import BadParameter

    from fusedce_cli.options import OutOption, _out_folder

    assert typing.get_args(OutOption)[0] == typing.Optional[str]
    assert _out_folder(Path("run")) == Path("run") and _out_folder("run") == Path("run") and _out_folder(None) is None
    with pytest.raises(BadParameter, match="an empty folder name"):
        _out_folder(" ")


def test_a_folder_no_run_wrote_is_refused_with_a_hint_that_works(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    result = CliRunner().invoke(app, [*TINY, "--backend", "torch", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "not a run folder" in _line(result) and "choose a new or empty folder" in _line(result)
    assert "pass --force" not in _line(result)  # --force would be refused too


def test_the_start_up_handlers_stay_until_the_command_starts(monkeypatch):
    """Ctrl-C while typer builds and parses the command line is the start-up handler's one line."""
    from fusedce_cli import ending
    from fusedce_cli import entry
    from fusedce_profile.signals import raise_terminated

    seen = []

    def run_command_line():
        seen.append(signal.getsignal(signal.SIGINT))
        entry.command_starting()  # what the command line's top-level callback does
        seen.append(signal.getsignal(signal.SIGINT))

    monkeypatch.setattr(ending, "main", run_command_line)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        entry.main()
        assert seen == [entry._stop_while_starting, before[signal.SIGINT]]
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        # from the command's start, SIGTERM and SIGHUP stop it as Ctrl-C does (an exception, not death);
        # one the caller set to be ignored (nohup's SIGHUP) stays ignored
        for sig in (signal.SIGTERM, signal.SIGHUP):
            expected = signal.SIG_IGN if before[sig] is signal.SIG_IGN else raise_terminated
            assert signal.getsignal(sig) is expected, sig
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("line", [b"garbage", b'{"ok": true, "reply": {}}', b'{"ok": true, "result": {}, "id": "t"}',
                                  b'{"ok": false, "error": 3, "id": "t"}', b"[1]", b'{"ok": true, "reply": 1, "id": "u"}'])
def test_a_reply_line_without_the_jobs_token_and_shape_is_not_taken(line):
    from fusedce_profiler.instrument.worker import _parsed, _reply

    assert _reply(_parsed(line), "t") is None
    assert _reply(_parsed(b'{"ok": true, "reply": 1, "id": "t"}'), "t") == {"ok": True, "reply": 1, "id": "t"}


def test_a_lone_surrogate_in_a_message_and_a_flooded_reply_pipe_are_failed_cells_of_a_run_that_goes_on(
        modules, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--backend", "uc_backends:surrogate", "--backend", "uc_backends:flood",
                                      "--backend", "torch", "--cell-timeout", "20", "--out", str(out)])
    assert result.exit_code == 1, result.output
    rows = {row["spec"]["backend"]: row for row in map(json.loads, (out / RESULTS_FILE).read_text().splitlines())}
    assert rows["torch"]["status"] == "ok"
    assert rows["uc_backends:surrogate"]["status"] == "error"
    assert rows["uc_backends:flood"]["status"] in ("error", "timeout")
    assert "\\udc80" in (out / "summary.md").read_text()  # spelled out: no UTF-8 file or terminal takes it raw
    rebuilt = CliRunner().invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 1, rebuilt.output  # named back-ends failed; the folder reads back


def test_a_backend_raising_keyboard_interrupt_is_a_failure_of_its_own_not_a_signal(modules, tmp_path):
    """No signal reaches a worker from the terminal (it runs in its own session): a
    ``KeyboardInterrupt`` there is the back-end's own exception, reported as raised — never as the
    worker killed by SIGINT, never as the command stopped."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY, "--backend", "torch", "--backend", "uc_backends:interrupts",
                                      "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "KeyboardInterrupt: from the back-end" in result.output, result.output
    assert "SIGINT" not in result.output and "interrupted" not in result.output.lower(), result.output
