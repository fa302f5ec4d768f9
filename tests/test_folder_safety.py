"""The folder a run writes into, and what a run does when its surroundings are hostile.

``--out`` (and a recorder's ``out``) that is a symbolic link, a folder inside another run's, a
``--force`` that would remove a live run's folder, a named pipe where the lock note, a record or
a ``--config`` is, a second run of a training callback into the same folder, two recorders in
two threads, a relative recorder folder and a change of the current folder, SIGHUP, a standard
output its reader closed, a newline in a folder's name: each is refused or degraded in one line,
and nothing outside the folder named is removed. Every test runs in this process (the CLI
through ``CliRunner``) unless it needs a process of its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile import StepRecorder
from fusedce_profile.folders import OutputDirError, prepare_out_dir
from fusedce_profile.report import report_command
from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument import store
from processes import REPO, cli_env
from run_records import TOOL_ENVIRONMENT, plant_environment
from test_cli_faults import TINY
from test_recording import _Trainer, _batch, _lightning_fit, _loss, hf_callback, lightning_callback  # noqa: F401
from tests.doctor_models import WrappedHeadLM

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

RUN_FILES = {store.RESULTS_FILE: "{}\n", store.PLAN_FILE: "{}\n", "summary.md": "# the run\n",
             store.ENVIRONMENT_FILE: TOOL_ENVIRONMENT}


def _finished_run(folder: Path) -> dict[str, str]:
    """``folder`` holding a finished grid run's files; returns them (name → text) to compare after."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in RUN_FILES.items():
        (folder / name).write_text(text)
    return _contents(folder)


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_exit_2(result, *needles: str) -> None:
    text = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for needle in needles:
        assert needle in text, text


@contextmanager
def _unblocked(fifo: Path, seconds: float = 20):
    """Fail (instead of hanging the suite) when the block is still waiting on ``fifo`` after
    ``seconds``: the pipe is then opened from the other end, which lets the waiting open go on."""
    def release() -> None:
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield
    finally:
        hung = not timer.is_alive()
        timer.cancel()
    assert not hung, f"waited on the named pipe {fifo}"


# --- a linked --out ---------------------------------------------------------------------------

def test_force_into_a_linked_out_removes_nothing_and_is_one_line(tmp_path):
    """``grid --force --out LINK`` (LINK a link to a finished run) deleted the run's files in the
    link's target before the link was refused."""
    before = _finished_run(tmp_path / "run")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--out", str(tmp_path / "link"),
                                      "--force"])
    _one_line_exit_2(result, f"--out {tmp_path / 'link'}: a symbolic link; a run writes only into the folder it names")
    assert _contents(tmp_path / "run") == before


@pytest.mark.parametrize("command", [
    [*TINY, "--tokens", "8", "--backend", "torch"],
    ["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8", "--no-trace"],
    ["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10"],
    ["doctor", "--device", "cpu", "--preset", "tiny", "--loss", "test_model_cli:unshifted_wrapper"],
    ["explain", "--device", "cpu", "--preset", "tiny", "--seq", "32", "--naive", "3", "--fused", "2", "--card", "24"],
], ids=lambda command: command[0])
def test_every_command_refuses_a_linked_out_in_one_line(tmp_path, command):
    """``model``, ``parity``, ``doctor`` and ``explain`` printed a traceback of ~50 lines and exited 1."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "link")])
    _one_line_exit_2(result, f"--out {tmp_path / 'link'}: a symbolic link")
    assert not list((tmp_path / "empty").iterdir())


def test_the_recorder_refuses_a_linked_snapshots_folder_and_removes_nothing_outside(tmp_path):
    """``StepRecorder(force=True)`` followed a linked ``snapshots/`` and removed ``step-*`` files outside."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "step-2.pickle").write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / store.RECORDED_STEPS_FILE).write_text("{}\n")
    (run / store.SNAPSHOTS_DIR).symlink_to(outside)
    with pytest.warns(RuntimeWarning, match=f"not recording into {run}: {run / store.SNAPSHOTS_DIR}: a symbolic link"):
        recorder = StepRecorder(WrappedHeadLM(), run, steps=(0,), trace=False, force=True)
    assert not recorder.enabled and (outside / "step-2.pickle").read_text() == "keep"
    assert (run / store.RECORDED_STEPS_FILE).read_text() == "{}\n"
    assert not (run / store.LOCK_FILE).exists()


def test_the_recorder_refuses_a_linked_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.warns(RuntimeWarning, match="a symbolic link; a run writes only into the folder it names"):
        recorder = StepRecorder(WrappedHeadLM(), tmp_path / "link", steps=(0,), trace=False)
    assert not recorder.enabled and not list((tmp_path / "real").iterdir())


def test_the_recorder_refuses_the_folder_of_another_kind_of_run(tmp_path):
    """A recorder pointed at a grid's folder replaced its summary and environment."""
    before = _finished_run(tmp_path / "grid")
    with pytest.warns(RuntimeWarning, match=r"the folder of a grid run \(results.jsonl\); a recording goes into a "
                                            "folder of its own"):
        recorder = StepRecorder(WrappedHeadLM(), tmp_path / "grid", steps=(0,), trace=False)
    model = recorder.model
    with recorder.step():
        _loss(model, _batch(0)).backward()
    recorder.close()
    assert _contents(tmp_path / "grid") == before


def test_the_recorder_refuses_a_folder_inside_another_runs(tmp_path):
    """A recording into ``GRID/plots/rec`` was taken; the grid's ``--force`` then removed it."""
    before = _finished_run(tmp_path / "grid")
    inner = tmp_path / "grid" / "plots" / "rec"
    with pytest.warns(RuntimeWarning, match=rf"not recording into {inner}: {inner}: inside the folder of another run "
                                            rf"\({tmp_path / 'grid'}, which holds "):
        recorder = StepRecorder(WrappedHeadLM(), inner, steps=(0,), trace=False)
    model = recorder.model
    with recorder.step():
        _loss(model, _batch(0)).backward()
    recorder.close()
    assert not recorder.enabled and not inner.exists() and _contents(tmp_path / "grid") == before


# --- a run inside another run's folder --------------------------------------------------------

def test_out_inside_another_runs_folder_is_refused(tmp_path):
    """``--out RUN/plots/inner`` was accepted; ``--force`` of RUN then removed the inner run."""
    _finished_run(tmp_path / "run")
    with pytest.raises(OutputDirError, match=r"inside the folder of another run \(.*run, which holds results.jsonl\)"):
        prepare_out_dir(tmp_path / "run" / "plots" / "inner", force=False, resume=False)
    assert not (tmp_path / "run" / "plots").exists()


def test_a_project_folder_holding_a_file_of_a_records_name_is_no_run_folder(tmp_path):
    """A project's own ``plan.json`` or ``environment.json`` at its root refused every run and
    recording below it, though ``report`` of it said it held no run; a live run's lock still counts."""
    project = tmp_path / "proj"
    (project / "runs").mkdir(parents=True)
    (project / "plan.json").write_text("{}")
    (project / "environment.json").write_text("{}")
    assert prepare_out_dir(project / "runs" / "g1", force=False, resume=False).is_dir()
    live = store.RunLock(tmp_path / "live").acquire() if (tmp_path / "live").mkdir() is None else None
    try:
        with pytest.raises(OutputDirError, match=r"inside the folder of another run \(.*live, which holds the lock "
                                                  r"of a live run, pid"):
            prepare_out_dir(tmp_path / "live" / "inner", force=False, resume=False)
    finally:
        live.release()


def test_the_python_doctor_prepares_its_folder_as_every_command_does(tmp_path):
    """``fusedce_profile.doctor(out=RUN/logs/inner)`` was accepted (its own folder code knew links only)."""
    from fusedce_profile import doctor

    before = _finished_run(tmp_path / "run")
    with pytest.raises(UsageError, match="inside the folder of another run"):
        doctor("tests.doctor_wrappers:correct", preset="tiny", device="cpu", out=tmp_path / "run" / "logs" / "inner")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a run folder"):
        doctor("tests.doctor_wrappers:correct", preset="tiny", device="cpu", out=tmp_path / "mine", force=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine" and _contents(tmp_path / "run") == before


def test_force_never_removes_a_folder_a_live_run_holds(tmp_path):
    before = _finished_run(tmp_path / "run")
    inner = tmp_path / "run" / store.LOGS_DIR / "inner"
    lock = store.RunLock(inner).acquire()  # a live run, made before nesting was refused
    try:
        with pytest.raises(OutputDirError, match=f"--force would remove {inner}, the folder of a run still live"):
            prepare_out_dir(tmp_path / "run", force=True, resume=False)
        assert _contents(tmp_path / "run") == {**before, f"{store.LOGS_DIR}/inner/{store.LOCK_FILE}":
                                               (inner / store.LOCK_FILE).read_text()}
    finally:
        lock.release()



@pytest.mark.parametrize("name, text", [
    (store.ENVIRONMENT_FILE, '{"name": "proj", "dependencies": ["numpy"]}'),
    (store.ENVIRONMENT_FILE, '{"python": "3.11", "torch": "2.5", "date": "x", "platform": "y", "seed": 1}'),
    (store.PLAN_FILE, '{"steps": 3}\n'),
    (store.PLAN_FILE, "not json"),
    (store.MODEL_PLAN_FILE, '{"jobs": [{"name": "a"}]}'),
    ("interrupted.json", '{"signal": "Ctrl-C"}'),
    (store.RESULTS_FILE, '{"epoch": 1, "loss": 2.5}\n'),
    ("fit.json", "{}"),
    ("doctor.json", '{"passed": true}'),
])
def test_a_project_folder_holding_a_file_of_a_records_name_is_no_run_folder(tmp_path, name, text):
    """A project's own ``environment.json``, ``plan.json`` or ``results.jsonl`` made the folder a run's:
    ``--force`` then removed the project's ``logs/``, ``plots/`` and ``summary.md`` whole."""
    project = tmp_path / "proj"
    for path, content in {"logs/train.log": "epoch 1", "plots/loss.png": "png", "summary.md": "# mine",
                          name: text}.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(content)
    before = _contents(project)
    for force, resume in ((True, False), (False, True)):
        with pytest.raises(OutputDirError, match="not a run folder"):
            prepare_out_dir(project, force=force, resume=resume)
    assert _contents(project) == before


def test_force_replaces_a_run_cut_before_it_measured_anything(tmp_path):
    """The records a run writes first (its plan, environment and interruption mark) still make its
    folder a run's when they read as the tool's."""
    from fusedce_profiler.grid.plan import save_plan
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.instrument.interruption import Interruption, mark_interrupted
    from fusedce_profiler.instrument.records import CellSpec

    run = tmp_path / "run"
    run.mkdir()
    save_plan(run, [CellSpec(backend="torch", tokens=8, hidden=32, vocab=256)], {"warmup": 0, "repeats": 1})
    save_environment(run, collect_environment())
    mark_interrupted(run, Interruption("Ctrl-C", "0 of 1 cells", "the same command"))
    (run / store.LOGS_DIR).mkdir()
    assert prepare_out_dir(run, force=True, resume=False) == run
    assert list(run.iterdir()) == []


@pytest.mark.parametrize("record", [store.RESULTS_FILE, store.EXPLAIN_STEPS_FILE])
def test_force_never_removes_a_finished_run_nested_in_its_artefacts(tmp_path, record):
    """A grid cut before its first cell holds no result: a run nested in its ``plots/`` was accepted,
    and its ``--force`` then removed that finished run without a word; so with an explain killed
    before it stored its explanation (its finished steps alone, kept for ``--resume``)."""
    before = _finished_run(tmp_path / "run")
    inner = tmp_path / "run" / store.PLOTS_DIR / "inner"
    inner.mkdir(parents=True)
    (inner / record).write_text("{}\n")
    with pytest.raises(OutputDirError, match=f"--force would remove {inner}, the folder of another run "
                                             f"\\(it holds {record}\\); move it out first"):
        prepare_out_dir(tmp_path / "run", force=True, resume=False)
    assert (inner / record).is_file()
    assert {name: text for name, text in _contents(tmp_path / "run").items() if "inner" not in name} == before


def test_a_results_file_with_another_name_is_read_as_the_file_it_is(tmp_path):
    """A file only read may be a hard link (a folder copied with ``cp -al``): read, bounded and
    validated as any; a row of another shape is a problem named by its line, not rendered."""
    from fusedce_profiler.grid.runner import load_results
    from fusedce_profiler.instrument.records import CellResult, CellSpec

    elsewhere = tmp_path / "kept.jsonl"
    row = CellResult(CellSpec("torch", 8, 256, 32, mode="fp32", device="cpu"), status="error", message="boom")
    elsewhere.write_text(json.dumps(row.to_dict()) + "\n" + '{"user": "root", "password": "x"}\n')
    (tmp_path / "run").mkdir()
    os.link(elsewhere, tmp_path / "run" / store.RESULTS_FILE)
    loaded = load_results(tmp_path / "run")
    assert [r.spec.backend for r in loaded.records] == ["torch"]
    assert len(loaded.problems) == 1 and ":2: not a valid row" in loaded.problems[0], loaded.problems


def test_a_folder_whose_lock_cannot_be_written_is_not_left_behind(tmp_path):
    """The default run on a full disk failed in one line at its lock, leaving an empty
    ``fusedce-profile-*`` folder, one more at each retry."""
    import errno

    def full(folder):
        (folder / store.LOCK_FILE).touch()  # created, then its note could not be written
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / store.LOCK_FILE))

    with pytest.raises(OSError, match="No space left"):
        prepare_out_dir(tmp_path / "new", force=False, resume=False, lock=full)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made is theirs: kept
    with pytest.raises(OSError, match="No space left"):
        prepare_out_dir(tmp_path / "mine", force=False, resume=False, lock=full)
    assert (tmp_path / "mine").is_dir()

# --- named pipes where the tool writes -------------------------------------------------------

def test_a_pipe_as_the_lock_note_is_refused_not_waited_on(tmp_path):
    """A FIFO named ``.lock`` made ``report DIR`` hang for ever (the note was opened to be written)."""
    _finished_run(tmp_path / "run")
    os.mkfifo(tmp_path / "run" / store.LOCK_FILE)
    with _unblocked(tmp_path / "run" / store.LOCK_FILE):
        with pytest.raises(UsageError, match=f"{tmp_path / 'run' / store.LOCK_FILE}: not a regular file"):
            report_command(tmp_path / "run")


# --- a second run of a callback into the same folder ------------------------------------------

def _hf_train(callback, tmp_path, steps: int = 2) -> None:
    model = WrappedHeadLM()
    args = types.SimpleNamespace(output_dir=str(tmp_path / "hf-out"))
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback.on_train_begin(args, state, None, model=model)
    for i in range(steps):
        callback.on_step_begin(args, state, None)
        _loss(model, _batch(i)).backward()
        state.global_step += 1
        callback.on_step_end(args, state, None)
    callback.on_train_end(args, state, None)


def test_a_second_hf_run_with_default_options_is_recorded_beside_the_first(tmp_path, hf_callback):
    """The second ``Trainer.train()`` into the same default folder stopped with FileExistsError."""
    _hf_train(hf_callback(steps=(0,), trace=False, report=False), tmp_path)
    second = hf_callback(steps=(0,), trace=False, report=False)
    first = tmp_path / "hf-out" / "fusedce-profile"
    with pytest.warns(RuntimeWarning, match=f"{first} already holds a recording; this run is recorded in {first}-2"):
        _hf_train(second, tmp_path)
    assert second.folder == Path(f"{first}-2") and len(second.recorder.records) == 1


def test_one_hf_callback_used_for_a_second_run_records_it_beside_the_first(tmp_path, hf_callback):
    """One callback kept for a second ``train()``: it fed the second run to its closed recorder, which
    recorded nothing and said nothing."""
    callback = hf_callback(steps=(0,), trace=False, report=False)
    _hf_train(callback, tmp_path)
    first = tmp_path / "hf-out" / "fusedce-profile"
    with pytest.warns(RuntimeWarning, match=f"this run is recorded in {first}-2"):
        _hf_train(callback, tmp_path)
    assert callback.folder == Path(f"{first}-2") and len(callback.recorder.records) == 1


def test_a_second_lightning_fit_into_a_fixed_out_is_recorded_beside_the_first(tmp_path, lightning_callback):
    out = tmp_path / "profile"
    for run in range(2):
        trainer = _Trainer(tmp_path / "logs")
        callback = lightning_callback(steps=(1,), out=out, trace=False, report=False)
        with pytest.warns(RuntimeWarning, match="this run is recorded in") if run else nullcontext():
            _lightning_fit(callback, WrappedHeadLM(), trainer, steps=2, validate_after=set())
        assert trainer.global_step == 2 and len(callback.recorder.records) == 1
    assert callback.folder == tmp_path / "profile-2"


def test_one_lightning_callback_used_for_a_second_fit_records_it_beside_the_first(tmp_path, lightning_callback):
    """One callback kept for a second ``fit``: it fed the second fit to its closed recorder, which
    recorded nothing and said nothing."""
    out = tmp_path / "profile"
    callback = lightning_callback(steps=(1,), out=out, trace=False, report=False)
    for run in range(2):
        trainer = _Trainer(tmp_path / "logs")
        with pytest.warns(RuntimeWarning, match="this run is recorded in") if run else nullcontext():
            _lightning_fit(callback, WrappedHeadLM(), trainer, steps=2, validate_after=set())
        assert trainer.global_step == 2 and len(callback.recorder.records) == 1
    assert callback.folder == tmp_path / "profile-2"


# --- two recorders at once --------------------------------------------------------------------

TWO_THREADS = textwrap.dedent('''
    import sys, threading, warnings, torch
    import torch.nn.functional as F
    from fusedce_profile import StepRecorder
    from tests.doctor_models import VOCAB, WrappedHeadLM

    def _batch(seed, batch=2, seq=16):  # test_recording's (importing that module costs a second here)
        ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
        return {"input_ids": ids, "labels": ids.clone()}

    def _loss(model, batch):
        logits = model(batch["input_ids"])[:, :-1]
        return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))

    original = torch.Tensor.backward, torch.autograd.backward
    start = threading.Barrier(2)

    def train(name):
        model = WrappedHeadLM()
        recorder = StepRecorder(model, f"{sys.argv[1]}/{name}", steps=(0, 1, 2), report=False)
        start.wait()
        for i in range(3):
            with recorder.step():
                _loss(model, _batch(i)).backward()
        recorder.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=train, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print("restored", (torch.Tensor.backward, torch.autograd.backward) == original)
    for warning in caught:
        print("warning:", warning.message)
''')


def test_two_recorders_in_two_threads_record_one_step_at_a_time(tmp_path):
    """Two recorders in two threads hung (or crashed) with ``Tensor.backward`` left wrapped."""
    done = subprocess.run([sys.executable, "-c", TWO_THREADS, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=cli_env(REPO / "tests"))
    assert done.returncode == 0, done.stderr
    assert "restored True" in done.stdout, done.stdout
    assert "another StepRecorder is recording a step in this process" in done.stdout, done.stdout


# --- SIGHUP -----------------------------------------------------------------------------------

class _OtherHandler(Exception):
    """Raised by the handler a test installs before: the signal did not reach the tool's handler."""


def test_sighup_stops_a_command_as_sigterm_does_with_exit_129(monkeypatch):
    """SIGHUP (the terminal closed) ended a run at once, exit 129, with no word and a stale ``.lock``."""
    import signal

    from fusedce_profile.signals import interrupt_exit_code, signal_name, stop_on_sigterm

    def other(signum, frame):
        raise _OtherHandler()

    previous = signal.signal(signal.SIGHUP, other)
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            with stop_on_sigterm():
                os.kill(os.getpid(), signal.SIGHUP)
        assert (interrupt_exit_code(stopped.value), signal_name(stopped.value)) == (129, "SIGHUP")
        assert signal.getsignal(signal.SIGHUP) is other  # restored after the block
    finally:
        signal.signal(signal.SIGHUP, previous)


# --- a named pipe as --config -----------------------------------------------------------------

def test_a_pipe_given_as_config_is_named_for_what_it_is(tmp_path):
    """``--config FIFO`` was refused as a file that "does not exist"."""
    os.mkfifo(tmp_path / "config.json")
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--config", str(tmp_path / "config.json"),
                                      "--out", str(tmp_path / "run")])
    _one_line_exit_2(result, f"{tmp_path / 'config.json'}: not a regular file (a named pipe)")
    assert not (tmp_path / "run").exists()


def test_a_pipe_given_as_hf_is_refused_without_being_opened(tmp_path):
    """``--hf PIPE`` is refused as what it is, before anything reads it (a read would block)."""
    os.mkfifo(tmp_path / "tiny")
    with _unblocked(tmp_path / "tiny"):
        result = CliRunner().invoke(app, ["model", "--hf", str(tmp_path / "tiny"), "--device", "cpu",
                                          "--out", str(tmp_path / "run")])
    _one_line_exit_2(result, f"--hf '{tmp_path / 'tiny'}': not a regular file")
    assert not (tmp_path / "run").exists()


# --- a relative recorder folder ---------------------------------------------------------------

def test_a_relative_recorder_folder_stays_where_it_was_made(tmp_path, monkeypatch):
    """A relative ``out`` and a change of the current folder between steps wrote to two folders,
    the second without a lock."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    recorder = StepRecorder(WrappedHeadLM(), "runs/mine", steps=(0, 1), trace=False, report=False)
    model = recorder.model
    for index in range(2):
        with recorder.step():
            _loss(model, _batch(index)).backward()
        monkeypatch.chdir(tmp_path / "second")
    recorder.close()
    assert len((tmp_path / "first" / "runs/mine" / store.RECORDED_STEPS_FILE).read_text().splitlines()) == 2
    assert not (tmp_path / "second" / "runs").exists()


# --- a recording folder that is full ---------------------------------------------------------

def test_a_folder_holding_the_most_steps_takes_no_more_and_training_goes_on(tmp_path, monkeypatch):
    """Sessions appending to one folder could pass the reader's line limit (each session was
    checked alone): the report then refused the whole folder."""
    from fusedce_profiler.instrument import capacity

    monkeypatch.setattr(capacity, "MAX_RECORDED_STEPS", 2)
    for session in range(2):
        recorder = StepRecorder(WrappedHeadLM(), tmp_path / "rec", steps=(0,), trace=False, report=False,
                                append=session > 0, label=f"session {session}")
        with recorder.step():
            _loss(recorder.model, _batch(session)).backward()
        recorder.close()
    steps = tmp_path / "rec" / store.RECORDED_STEPS_FILE
    before = steps.read_bytes()
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "rec", steps=(0, 1), trace=False, report=False, append=True)
    trained = 0
    with pytest.warns(RuntimeWarning, match="holds 2 recorded steps, the most a folder holds"):
        for index in range(2):
            with recorder.step():
                _loss(recorder.model, _batch(index)).backward()
            trained += 1
    recorder.close()
    assert trained == 2 and steps.read_bytes() == before


def test_a_line_that_would_pass_the_size_limit_is_not_appended(tmp_path, monkeypatch):
    from fusedce_profiler.instrument import confined

    path = tmp_path / store.RESULTS_FILE
    store.append_jsonl(path, {"a": 1})
    monkeypatch.setitem(confined.SIZE_LIMITS, store.RESULTS_FILE, path.stat().st_size + 4)
    with pytest.raises(store.FileFull, match=f"{store.RESULTS_FILE}: full"):
        store.append_jsonl(path, {"a": 2})
    assert path.read_text() == '{"a": 1}\n'


# --- a reader that goes away -----------------------------------------------------------------

def test_a_closed_stdout_stops_the_printing_not_the_run(tmp_path, monkeypatch):
    """``grid ... | head -1``: the run stopped at the next line printed, exit 1, without a word,
    its cells and report lost."""
    from fusedce_profile.console import make_console
    from fusedce_profile.grid import grid_command

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone, as head -1 does after its line
    with os.fdopen(write_end, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        outcome = grid_command(tokens=[8, 16], hidden=[32], vocab=[256], backend=["torch"], device="cpu",
                               repeats=1, warmup=0, out=tmp_path / "run", console=make_console(to_stderr=False))
        monkeypatch.undo()
    assert outcome.exit_code == 0
    out = tmp_path / "run"
    assert len((out / store.RESULTS_FILE).read_text().splitlines()) == 2 and (out / "summary.md").is_file()
    assert not (out / store.LOCK_FILE).exists()


@pytest.mark.parametrize("stdout", ["closed", "/dev/full"])
def test_a_standard_output_closed_or_full_from_the_start_is_a_run_without_its_printing(tmp_path, stdout):
    """``grid ... >&-`` and ``grid ... >/dev/full`` ended in a traceback (exit 1), the second with an
    empty run folder left. The run goes on, its folder whole; a full output is said once on stderr."""
    from processes import start_cli

    out = tmp_path / "run"
    sink = open(os.devnull if stdout == "closed" else stdout, "w")
    try:
        process = start_cli([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)], cli_env(),
                            stdout=sink, preexec=(lambda: os.close(1)) if stdout == "closed" else None)
    finally:
        sink.close()
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err
    expected = [] if stdout == "closed" else [
        "fusedce-profile: the standard output cannot be written (No space left on device); the run goes on without it"]
    assert err.splitlines() == expected
    assert (out / "summary.md").is_file() and len((out / store.RESULTS_FILE).read_text().splitlines()) == 1


@pytest.mark.parametrize("args", [["grid", "--tokens", "x"], ["report", "no-such-folder"]], ids=["typer", "own"])
def test_bad_input_is_exit_2_when_the_error_output_cannot_be_written(tmp_path, args):
    """``2>/dev/full``: the refusal's line cannot be written; its exit code still says bad input."""
    from processes import start_cli

    with open("/dev/full", "w") as full:
        process = start_cli(args, cli_env(), cwd=tmp_path, stderr=full)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 2, out


@pytest.mark.parametrize("args", [["--help"], ["grid", "--help"]])
def test_help_to_a_full_output_is_one_line_never_a_traceback(tmp_path, args):
    """``--help >/dev/full``: the help text cannot be written; one line on stderr says so, exit 1."""
    from processes import start_cli

    with open("/dev/full", "w") as full:
        process = start_cli(args, cli_env(), cwd=tmp_path, stdout=full)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and "Traceback" not in err, err
    assert err.splitlines() == ["fusedce-profile: the output could not be written (No space left on device)"]


def test_an_output_encoding_without_the_reports_characters_spells_them_out(tmp_path):
    """``PYTHONIOENCODING=ascii``: a ``·`` or ``•`` the terminal cannot take ended a command in
    exit 2 ("bad input"); it is spelled out instead."""
    from processes import run_cli

    out = tmp_path / "run"
    done = run_cli([*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)],
                   cli_env(PYTHONIOENCODING="ascii"))
    assert done.returncode == 0, done.stderr
    assert "\\u2022" in done.stdout and (out / "summary.md").is_file()


# --- a newline in a folder's name -------------------------------------------------------------

def test_a_newline_in_the_folder_name_never_splits_the_error_line(tmp_path):
    out = tmp_path / "two\nlines"
    _finished_run(out)
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out)])
    _one_line_exit_2(result, f"--out {tmp_path}/two\\nlines: the folder is not empty")


def test_a_run_folder_file_that_cannot_be_written_is_named_never_taken_for_the_terminal(tmp_path):
    """A full disk under the run folder of ``model``, ``parity`` or ``doctor``: their OS error reached the
    entry point, which took it for the terminal ("the output could not be written", exit 1, no file named)."""
    code = ("import fusedce_cli.app as cli, fusedce_cli.ending as ending\n"
            "def full():\n"
            "    raise OSError(28, 'No space left on device', 'run/environment.json')\n"
            "cli.app = full\n"
            "ending.main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=cli_env())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == ["error: run/environment.json: No space left on device"]


def test_a_lock_note_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """On a full disk the note was created, its write failed, and the empty ``.lock`` stayed in a finished folder."""
    import errno

    from fusedce_profiler.instrument import runlock

    def full(fd, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlock.os, "ftruncate", full)
    with pytest.raises(OSError, match="No space left on device"):
        runlock.RunLock(tmp_path).acquire()
    assert not os.path.lexists(tmp_path / runlock.LOCK_FILE)


def test_force_that_cannot_empty_plots_names_the_file_and_keeps_the_records(tmp_path, monkeypatch):
    """A plot that cannot be removed (an immutable file, a folder owned by another user): the error names
    the whole path, and the run's records are removed last, so the folder is still its run's."""
    import errno

    from fusedce_profile.folders import prepare_out_dir

    out = tmp_path / "g"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "frontier.png").write_bytes(b"png")
    (out / "results.jsonl").write_text("{}\n")
    (out / "summary.md").write_text("page")
    plant_environment(out)
    real_unlink = os.unlink

    def refused(path, *args, **kwargs):
        if os.fspath(path).endswith("frontier.png"):
            raise PermissionError(errno.EPERM, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refused)
    with pytest.raises(PermissionError) as failed:
        prepare_out_dir(out, force=True, resume=False)
    assert failed.value.filename == str(out / "plots" / "frontier.png")
    assert (out / "results.jsonl").is_file()
