"""``model`` and ``parity`` under faults: a hostile ``--model`` factory, a named back-end that fails
every job, a signal mid-run, and ``--resume`` after one."""
from __future__ import annotations

import json
import os
from pathlib import Path
import signal
import textwrap
import time

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from processes import cli_env, kill_group, start_cli, wait_for, workers_of
from run_records import plant_environment

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

runner = CliRunner()

MODELS = textwrap.dedent('''
    import os, sys, time
    import torch
    from torch import nn

    class Wide(nn.Module):
        """V=100, H=32, and a wide body: 1.99 M parameters, nearly all outside the head."""
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 32)
            self.up = nn.Linear(32, 30000)
            self.down = nn.Linear(30000, 32)
            self.lm_head = nn.Linear(32, 100, bias=False)

        def forward(self, input_ids):
            return self.lm_head(self.down(torch.relu(self.up(self.embed(input_ids)))))

    def wide():
        return Wide()

    def raises():
        raise RuntimeError("boom\\nsecond line")

    class Unprintable(BaseException):
        """An exception whose message cannot be formed: its __str__ raises."""
        def __str__(self):
            raise ValueError("the message exploded")

    def unprintable():
        raise Unprintable()

    def exit0():
        sys.exit(0)

    def exit7():
        sys.exit(7)

    def hang():
        time.sleep(3600)

    def raises_memory_error():
        raise MemoryError("a cache of 10 GiB was refused")

    def allocate():
        keep = []
        while True:
            keep.append(bytearray(64 << 20))

    def _ends_in_a_step(end):
        """Builds its shapes (on the meta device); ``end()`` where a step builds the real model."""
        if torch.empty(0).device.type != "meta":
            end()
        return Wide()

    def _raise(exc):
        raise exc

    def raises_in_a_step():
        return _ends_in_a_step(lambda: _raise(RuntimeError("no real tensors here")))

    def value_error_in_a_step():  # the exception the tool's own option checks raise too
        return _ends_in_a_step(lambda: _raise(ValueError("no real tensors here")))

    def interrupt_in_a_step():
        return _ends_in_a_step(lambda: _raise(KeyboardInterrupt("no real tensors here")))

    def exit_in_a_step():
        return _ends_in_a_step(lambda: sys.exit(7))

    def unprintable_in_a_step():
        return _ends_in_a_step(lambda: _raise(Unprintable()))

    def two_arguments(a, b):
        return Wide()

    def not_a_module():
        return 3

    def ok(hidden, weight, target, bias=None, **options):
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, weight, bias), target)

    def boom(hidden, weight, target, bias=None, **options):
        raise RuntimeError("boom")

    def hang_loss(hidden, weight, target, bias=None, **options):
        mark = os.environ.get("FX_HANG_MARK")
        if mark:
            open(mark, "w").close()
        while True:
            time.sleep(1)
''')


@pytest.fixture
def fx(tmp_path, monkeypatch):
    """A folder holding module ``fx_models`` (factories and back-ends), on this process's path too."""
    folder = tmp_path / "fx"
    folder.mkdir()
    (folder / "fx_models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _plain(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow
def test_the_parameter_count_is_the_factorys_modules_own(fx, tmp_path):
    from fusedce_profile.model import plan_model

    wide = sum(p.numel() for p in __import__("fx_models").wide().parameters())
    plan = plan_model(model="fx_models:wide", device="cpu", batch=1, seq=8, backend=["torch"], trace=False)
    # what the run's first line and its memory check use: 2.0 M; the formula over H=32, V=100 said 0.0 M
    assert plan.source.parameters == wide


@pytest.mark.parametrize("factory, code, line", [
    ("raises", 1, "--model fx_models:raises: the factory raised RuntimeError: boom"),
    ("exit0", 1, "--model fx_models:exit0: the factory called sys.exit(0)"),
    ("exit7", 1, "--model fx_models:exit7: the factory called sys.exit(7)"),
    ("unprintable", 1, "--model fx_models:unprintable: the factory raised Unprintable: <its message could not be "
                       "formed: its __str__ raised ValueError>"),
    ("two_arguments", 2, "--model fx_models:two_arguments: cannot be called as factory() or factory(config)"),
    ("not_a_module", 2, "--model fx_models:not_a_module returned int, not an nn.Module"),
    ("missing", 2, "--model fx_models:missing"),
])
def test_a_hostile_factory_is_one_line_and_its_exit_code(fx, tmp_path, factory, code, line):
    out = tmp_path / "run"
    result = runner.invoke(app, ["model", "--device", "cpu", "--model", f"fx_models:{factory}", "--out", str(out)])
    assert result.exit_code == code, result.output
    assert line in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()  # refused before the run folder is made


@pytest.mark.parametrize("factory, line", [
    ("raises", "--model fx_models:raises: the factory raised RuntimeError: boom"),
    ("exit7", "--model fx_models:exit7: the factory called sys.exit(7)"),
    ("unprintable", "--model fx_models:unprintable: the factory raised Unprintable: <its message could not be formed"),
])
def test_explain_calls_a_hostile_factory_in_its_box(fx, tmp_path, factory, line):
    """``explain`` builds the user's model as ``model`` does: in a worker, one line, exit 1 (it
    called the factory in its own process: a traceback, or a silent exit 7)."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["explain", "--device", "cpu", "--model", f"fx_models:{factory}", "--seq", "8",
                                 "--naive", "3", "--fused", "2", "--card", "24", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert line in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("factory, raised", [
    ("raises_in_a_step", "raised RuntimeError: no real tensors here"),
    ("value_error_in_a_step", "raised ValueError: no real tensors here"),
    ("interrupt_in_a_step", "raised KeyboardInterrupt: no real tensors here"),
    ("exit_in_a_step", "called sys.exit(7)"),
    ("unprintable_in_a_step", "raised Unprintable: <its message could not be formed")])
def test_a_factory_that_fails_only_in_the_steps_is_named_as_the_cause_once(fx, tmp_path, factory, raised):
    """Its failure in every step is the factory's, not each back-end's: one line naming it (whatever
    it raised: a ValueError too, which the tool's own option checks raise; a KeyboardInterrupt or a
    sys.exit, which no Exception handler sees)."""
    result = runner.invoke(app, ["explain", "--device", "cpu", "--model", f"fx_models:{factory}", "--seq", "8",
                                 "--naive", "3", "--fused", "2", "--card", "24", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "torch, fusedce failed in every calibration step" in errors[0], result.output
    assert f"--model fx_models:{factory}: the factory {raised}" in errors[0]


def test_a_hanging_factory_is_stopped_by_its_time_limit(fx, tmp_path):
    # the limit is the factory's own: the worker imports torch before its clock starts
    result = runner.invoke(app, ["model", "--device", "cpu", "--model", "fx_models:hang", "--factory-timeout", "1",
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "--model fx_models:hang: the factory did not return within 1 s" in result.output


def test_an_allocating_factory_is_stopped_by_the_memory_guard(fx, tmp_path):
    from fusedce_profiler.instrument.models.factory import FactoryFailed, describe_factory

    with pytest.raises(FactoryFailed) as failed:
        describe_factory("fx_models:allocate", None, None, timeout_s=120, memory_bytes=256 << 20)
    assert "allocated more than the memory guard (0.2 GiB)" in str(failed.value)
    assert not failed.value.bad_signature


def test_a_factory_raising_memory_error_itself_is_given_both_readings(fx, tmp_path):
    """A ``MemoryError`` with a message was worded as the guard's alone; it may be the factory's own."""
    from fusedce_profiler.instrument.models.factory import FactoryFailed, describe_factory

    with pytest.raises(FactoryFailed) as failed:
        describe_factory("fx_models:raises_memory_error", None, None, timeout_s=120, memory_bytes=256 << 20)
    assert str(failed.value) == ("--model fx_models:raises_memory_error: the factory raised MemoryError: a cache of "
                                 "10 GiB was refused — it allocated more than the memory guard (0.2 GiB) allows, "
                                 "or raised it itself")


def test_a_named_backend_that_fails_every_job_exits_1_and_keeps_the_others(fx, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8",
                                 "--no-trace", "--backend", "torch", "--backend", "fx_models:boom", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "fx_models:boom failed in every job" in _plain(result.output)
    rows = [json.loads(line) for line in (out / "model_results.jsonl").read_text().splitlines()]
    assert [(r["job"]["backend"], r["status"]) for r in rows] == [("torch", "ok"), ("fx_models:boom", "error")]


@pytest.mark.slow
def test_a_signal_during_model_keeps_the_finished_jobs_and_marks_the_report(fx, tmp_path):
    """SIGTERM (exit 143) and Ctrl-C (exit 130), each to a run of its own; the two runs go side by side."""
    runs = {}
    try:
        for signum, code, name in ((signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")):
            out = tmp_path / name / "run"
            out.parent.mkdir()
            process = start_cli(["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8",
                                 "--no-trace", "--backend", "torch", "--backend", "fx_models:hang_loss", "--out",
                                 str(out)], cli_env(fx, FX_HANG_MARK=str(out.parent / "hung")))
            runs[signum] = (code, name, out, process)
        for signum, (_, _, out, process) in runs.items():
            wait_for((out.parent / "hung").exists, 180, "the hung job to start", process)
            os.killpg(process.pid, signum)
        said = {signum: process.communicate(timeout=120) for signum, (_, _, _, process) in runs.items()}
    finally:
        for *_, process in runs.values():
            kill_group(process)
    for signum, (code, name, out, process) in runs.items():
        stdout, stderr = said[signum]
        assert process.returncode == code, stderr
        assert f"Interrupted after 1 of 2 jobs; report {out}/summary.md; continue with the same command and " \
               f"--resume --out {out}" in _plain(stdout + stderr)
        assert workers_of(process.pid, wait_s=10) == []
        summary = (out / "summary.md").read_text()
        assert f"Interrupted by {name} after 1 of 2 jobs" in summary and "torch" in summary
        assert len((out / "model_results.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_model_resume_measures_only_the_missing_jobs_and_clears_the_mark(tmp_path):
    from fusedce_profile import profile_model
    from fusedce_profiler.instrument.interruption import Interruption, mark_interrupted

    out = tmp_path / "run"
    first = profile_model(preset="tiny", backend=["torch"], batch=1, seq=8, device="cpu", trace=False, out=out)
    mark_interrupted(out, Interruption("Ctrl-C", "1 of 2 jobs", "--resume"))
    rows = profile_model(preset="tiny", backend=["torch", "fusedce"], batch=1, seq=8, device="cpu", trace=False,
                         out=out, resume=True)
    assert [r.job.backend for r in rows] == ["torch", "fusedce"]
    assert rows[0].to_dict() == first[0].to_dict()  # kept, not measured again
    assert not (out / "interrupted.json").exists()
    assert "Interrupted" not in (out / "summary.md").read_text()


@pytest.mark.slow
def test_a_model_resume_with_other_options_is_refused_before_it_drops_the_unfinished_jobs(tmp_path):
    """A run cut before its second job leaves that job in ``model_plan.json`` only: a ``--resume``
    with another batch would measure other jobs beside the first run's and drop that one."""
    out = tmp_path / "run"
    args = ["model", "--device", "cpu", "--preset", "tiny", "--seq", "8", "--no-trace", "--out", str(out)]
    first = runner.invoke(app, [*args, "--batch", "1", "--backend", "torch"])
    assert first.exit_code == 0, first.output
    plan = json.loads((out / "model_plan.json").read_text())
    unfinished = {**plan["jobs"][0], "backend": "fusedce"}  # as a run stopped before its second job leaves it
    (out / "model_plan.json").write_text(json.dumps({"jobs": plan["jobs"] + [unfinished]}))
    rows = (out / "model_results.jsonl").read_text()

    other = runner.invoke(app, [*args, "--batch", "2", "--backend", "torch", "--backend", "fusedce", "--resume"])
    assert other.exit_code == 2, other.output
    assert (f"--resume: {out} holds a run planned with other jobs (1 unfinished of its 2 are not in this "
            "command's, e.g. fusedce at B=1 T=8, amp-bf16); give the options of the command that started it"
            ) in " ".join(_plain(other.output).split())
    assert len(json.loads((out / "model_plan.json").read_text())["jobs"]) == 2  # nothing replaced
    assert (out / "model_results.jsonl").read_text() == rows

    plan_text = (out / "model_plan.json").read_text()
    (out / "model_plan.json").write_text("[]")  # unreadable as a plan: what the first run planned is unknown
    unknown = runner.invoke(app, [*args, "--batch", "2", "--backend", "torch", "--resume"])
    assert unknown.exit_code == 2, unknown.output
    assert (f"{out / 'model_plan.json'}: not a plan of jobs (expected an object with a list of jobs); remove that "
            "file to resume with this command's jobs") in " ".join(_plain(unknown.output).split())
    (out / "model_plan.json").write_text(plan_text)

    os.link(out / "model_results.jsonl", tmp_path / "elsewhere.jsonl")  # an append would be refused: checked first
    linked = runner.invoke(app, [*args, "--batch", "1", "--backend", "torch", "--backend", "fusedce",
                                  "--backend", "torch-compile", "--resume"])
    assert linked.exit_code == 2 and "model_results.jsonl" in linked.output, linked.output
    assert len(json.loads((out / "model_plan.json").read_text())["jobs"]) == 2  # nothing replaced
    os.unlink(tmp_path / "elsewhere.jsonl")

    same = runner.invoke(app, [*args, "--batch", "1", "--backend", "torch", "--backend", "fusedce", "--resume"])
    assert same.exit_code == 0, same.output
    stored = [json.loads(line)["job"]["backend"] for line in (out / "model_results.jsonl").read_text().splitlines()]
    assert stored == ["torch", "fusedce"]  # the finished job kept, the unfinished one measured


@pytest.mark.slow
def test_a_signal_during_parity_keeps_the_trained_backends_and_marks_the_report(fx, tmp_path):
    out, mark = tmp_path / "run", tmp_path / "hung"
    process = start_cli(["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq",
                         "8", "--backend", "fusedce", "--backend", "fx_models:hang_loss", "--out", str(out)],
                        cli_env(fx, FX_HANG_MARK=str(mark)))
    try:
        wait_for(mark.exists, 180, "the hung back-end to start", process)
        os.killpg(process.pid, signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        kill_group(process)
    assert process.returncode == 143, stderr
    said = _plain(stdout + stderr)
    assert f"Interrupted after 1 of 2 back-ends; report {out}/summary.md; continue with the same command and " \
           f"--resume --out {out}" in said
    summary = (out / "summary.md").read_text()
    assert "Interrupted by SIGTERM after 1 of 2 back-ends" in summary and "fusedce" in summary


def test_a_parity_page_that_cannot_be_written_is_one_line_and_the_curves_are_kept(tmp_path):
    """The page is written after each curve as well as at the end: a page that is a folder (or a
    full disk) there ended parity in a traceback."""
    out = tmp_path / "run"
    args = ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq", "8",
            "--backend", "fusedce", "--no-control", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    (out / "summary.md").unlink()
    (out / "summary.md").mkdir()
    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    said = _plain(result.output)
    assert f"{out}/summary.md: Is a directory; the trained curves are kept in {out}" in said, said
    assert len(result.output.strip().splitlines()) <= 3 and (out / "parity.json").is_file()


def test_the_memory_check_counts_the_modules_parameters_not_a_formula(monkeypatch):
    import fusedce_profile.checks as checks
    from fusedce_profile.errors import UsageError
    from fusedce_profiler.instrument.models.configs import get_preset

    config = get_preset("tiny")
    monkeypatch.setattr(checks, "device_memory_bytes", lambda device: 16 * 10**6 + 10**6)
    checks.check_model_fits(config, "cpu", 1, 8, parameters=10**6)  # 16 MB of state fits in 17 MB
    with pytest.raises(UsageError, match=r"\(0\.00 B parameters\) needs at least"):
        checks.check_model_fits(config, "cpu", 1, 8, parameters=2 * 10**6)


def test_a_kill_9_during_the_factory_leaves_its_log_folder_to_the_next_command_only(fx, tmp_path, monkeypatch):
    """The factory's worker logs to a scratch folder (no run folder exists yet); a command killed
    with ``kill -9`` cannot remove it, a later command building a factory does once it is ten
    minutes old. Another live process's folder, a link and a file named so are left alone."""
    import tempfile

    from fusedce_profiler.instrument.scratch import scratch_folder

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = start_cli(["model", "--device", "cpu", "--model", "fx_models:hang", "--out", str(tmp_path / "run")],
                        cli_env(fx, TMPDIR=str(scratch)))
    try:
        left = lambda: [p for p in scratch.glob(f"fusedce-factory-{process.pid}-*") if any(p.glob("worker-*.log"))]
        wait_for(left, 120, "the factory's worker log", process)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        assert workers_of(process.pid, wait_s=20) == []
        assert left()  # a kill -9 removes nothing
    finally:
        kill_group(process)
    (scratch / f"fusedce-factory-{os.getpid()}-live").mkdir()  # a live process's
    (scratch / "fusedce-factory-999999999-link").symlink_to(tmp_path / "run", target_is_directory=True)
    (scratch / "fusedce-factory-999999999-file").write_text("")
    (scratch / f"fusedce-factory-{'9' * 30}-x").mkdir()  # a name made to overflow a pid
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with scratch_folder("factory"):  # the killed command's folder is newer than ten minutes: kept
        pass
    assert left()
    old = time.time() - 3600
    for folder in scratch.iterdir():
        for path in [*folder.glob("*"), folder] if not folder.is_symlink() else []:
            os.utime(path, (old, old))
    with scratch_folder("factory") as mine:
        assert mine.parent == scratch and mine.name.startswith(f"fusedce-factory-{os.getpid()}-")
    assert {p.name for p in scratch.iterdir()} == {
        "fusedce-factory-999999999-file", "fusedce-factory-999999999-link", f"fusedce-factory-{os.getpid()}-live"}


def test_a_left_folder_with_a_fresh_file_anywhere_in_it_is_kept(tmp_path, monkeypatch):
    """The sweep judges a folder by its newest entry at any depth: a check's worker logs to
    ``logs/`` inside it, so an old folder with an old ``logs/`` can still hold a log being written."""
    import tempfile

    from fusedce_profiler.instrument.scratch import scratch_folder

    left = tmp_path / "fusedce-check-999999999-x"
    (left / "logs").mkdir(parents=True)
    (left / "logs" / "worker.log").write_text("fresh")
    old = time.time() - 3600
    for path in (left / "logs", left):
        os.utime(path, (old, old))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_folder("check"):
        pass
    assert (left / "logs" / "worker.log").is_file()
    os.utime(left / "logs" / "worker.log", (old, old))
    with scratch_folder("check"):
        pass
    assert not left.exists()


def test_a_left_folder_nested_past_any_of_the_tools_is_kept_and_the_command_goes_on(tmp_path, monkeypatch):
    """A folder ~1,100 levels deep under a dead process's scratch name made every later command that
    checks a back-end end in a ``RecursionError`` (``shutil.rmtree`` recurses): deeper than any the
    tool makes, it is not judged, so kept."""
    import tempfile

    from fusedce_profiler.instrument.scratch import scratch_folder

    left = tmp_path / "fusedce-check-999999999-deep"
    deep = left
    for _ in range(50):  # past the sweep's bound; at ~1,000 levels rmtree's recursion gives out
        deep = deep / "d"
    os.makedirs(deep)
    old = time.time() - 3600
    os.utime(left, (old, old))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch_folder("check") as mine:
        assert mine.is_dir()
    assert left.is_dir()


def test_a_left_folder_with_a_file_system_mounted_inside_is_kept(tmp_path, monkeypatch):
    """As root, an outside folder bind-mounted inside a dead process's scratch folder had its files
    removed by the sweep (``rmtree`` crosses mount points; a bind mount has the same device). A folder
    holding any mount point this process sees is kept; the same folder without one is removed."""
    import tempfile

    from fusedce_profiler.instrument import scratch
    from fusedce_profiler.instrument.scratch import scratch_folder

    left = tmp_path / "fusedce-check-999999999-mounted"
    (left / "inside").mkdir(parents=True)
    (left / "inside" / "theirs.txt").write_text("not the tool's")
    old = time.time() - 3600
    for path in (left / "inside" / "theirs.txt", left / "inside", left):
        os.utime(path, (old, old))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_mount_points", lambda: ["/", os.path.realpath(left / "inside")])
    with scratch_folder("check"):
        pass
    assert (left / "inside" / "theirs.txt").read_text() == "not the tool's"
    monkeypatch.setattr(scratch, "_mount_points", lambda: ["/", str(tmp_path.parent)])  # above it: no matter
    with scratch_folder("check"):
        pass
    assert not left.exists()


def test_the_mount_table_is_read_with_its_escapes(tmp_path):
    from fusedce_profiler.instrument.scratch import _mount_points

    table = tmp_path / "mountinfo"
    table.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                     "40 22 8:1 /data /tmp/fusedce-check-1-a\\040b/in rw - ext4 /dev/sda1 rw\n")
    assert _mount_points(str(table)) == ["/", "/tmp/fusedce-check-1-a b/in"]
    assert _mount_points(str(tmp_path / "none")) == []


def test_a_stored_reference_that_did_not_train_is_trained_again_on_resume(tmp_path):
    """No run stores a failed torch curve, so one in the folder was put there by hand: ``--resume``
    keeps none of its verdicts (they were judged against no reference) and trains again."""
    out = tmp_path / "run"
    args = ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq", "8",
            "--backend", "fusedce", "--no-control", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    stored = json.loads((out / "parity.json").read_text())
    reference = next(c for c in stored["curves"] if c["backend"] == "torch")
    reference.update(status="error", message="planted")
    (out / "parity.json").write_text(json.dumps(stored))
    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert "training with torch" in result.output and "training with fusedce" in result.output
    curves = json.loads((out / "parity.json").read_text())["curves"]
    assert [c["status"] for c in curves] == ["ok", "ok"]


def test_a_reference_that_fails_to_train_is_a_failed_run_in_one_line(tmp_path, monkeypatch):
    """torch's own curve failing is a failed run (exit 1, nothing judged), not bad input; the Python
    API raises it."""
    from fusedce_profile.parity import _CurveTrainer, parity
    from fusedce_profiler.judgements.parity import ParityCurve
    from fusedce_profiler.judgements.parity_training import ReferenceFailed

    monkeypatch.setattr(_CurveTrainer, "__call__",
                        lambda self, name, perturbed: ParityCurve(name, status="error", message="no memory left"))
    out = tmp_path / "run"
    args = ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq", "8",
            "--backend", "fusedce", "--no-control", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"parity: FAIL, nothing judged: the torch reference run failed: error: no memory left; logs in {out}/logs")
    with pytest.raises(ReferenceFailed, match="no memory left"):
        parity(preset="tiny", device="cpu", steps=10, batch=2, seq=8, backend=["fusedce"], control=False,
                   out=tmp_path / "api")


def test_a_first_curve_that_cannot_be_stored_says_nothing_is_kept(tmp_path):
    """Before the first curve is stored nothing is kept: the line says so and how to go on, never
    "the curves trained before are kept" with a ``report`` that would be refused."""
    out = tmp_path / "run"
    (out / "parity.json").mkdir(parents=True)  # as a disk full before the first curve was stored
    plant_environment(out)  # stored as the run started
    args = ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq", "8",
            "--backend", "fusedce", "--no-control", "--out", str(out), "--resume"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    said = _plain(result.output)
    assert (f"{out}/parity.json: Is a directory; no curves are kept in {out}: the same command with --resume "
            f"--out {out} trains them once that is mended") in said, said


def test_model_under_a_launcher_is_refused_in_one_line_before_any_folder(tmp_path):
    """Under torchrun every rank measured the same jobs into one folder: one failed on "the folder is
    not empty", the other was left as an interrupted run that asked for --resume."""
    out = tmp_path / "never-made"
    for world in ("2", "8"):
        result = runner.invoke(app, ["model", "--device", "cpu", "--preset", "tiny", "--out", str(out)],
                               env={"WORLD_SIZE": world, "RANK": "1"})
        assert result.exit_code == 2, result.output
        assert (f"model runs in one process, and WORLD_SIZE='{world}' says this is one rank of several (torchrun): "
                "run it without a launcher") in " ".join(_plain(result.output).split())
        assert not out.exists()
