"""Profiling never stops training: the recorder and both callbacks on a folder that cannot be
written, that another run holds, or whose disk fills, warn and let the steps run."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
import types
import warnings

import pytest
import torch

from fusedce_profile import StepRecorder
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.recording.records import load_recorded_steps
from test_recording import _Trainer, _batch, _lightning_fit, _loss, hf_callback, lightning_callback  # noqa: F401
from tests.doctor_models import WrappedHeadLM

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults


@pytest.fixture
def unwritable(tmp_path):
    """A folder that cannot be created: its parent is a file (permissions do not stop root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "profile"


@pytest.fixture
def held(tmp_path):
    """A folder whose lock another process holds for the length of the test."""
    folder = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from fusedce_profiler.instrument import store; "
                               f"store.RunLock({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield folder
    holder.kill()
    holder.wait(timeout=30)


def _train(recorder, steps: int = 3) -> int:
    model = recorder.model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    done = 0
    for i in range(steps):
        with recorder.step():
            _loss(model, _batch(i)).backward()
            optimizer.step()
            optimizer.zero_grad()
        done += 1
    recorder.close()
    return done


@pytest.mark.parametrize("where", ["unwritable", "held"])
def test_the_recorder_warns_and_training_goes_on(where, request):
    folder = request.getfixturevalue(where)
    with pytest.warns(RuntimeWarning, match=f"not recording into {folder}.*training goes on"):
        recorder = StepRecorder(WrappedHeadLM(), folder, steps=(1,), trace=False)
    assert _train(recorder) == 3 and recorder.records == []


@pytest.mark.parametrize("where", ["unwritable", "held"])
def test_under_warnings_as_errors_the_recorder_says_it_on_stderr_and_training_goes_on(where, request, capsys):
    """With ``-W error`` (pytest's ``filterwarnings = ["error"]``) each "carry on with a warning" raised
    inside the training loop's hooks and ended ``Trainer.train()``; the line now goes to standard error."""
    import warnings

    folder = request.getfixturevalue(where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recorder = StepRecorder(WrappedHeadLM(), folder, steps=(1,), trace=False)
        assert _train(recorder) == 3 and recorder.records == []
    said = capsys.readouterr().err
    assert f"fusedce-profile: not recording into {folder}" in said and "training goes on unrecorded" in said


@pytest.mark.parametrize("kind", ["named pipe", "hard link", "folder"])
def test_a_steps_file_that_no_recording_could_be_is_named_as_such_and_training_goes_on(tmp_path, kind):
    """A named pipe, a hard link or a folder named ``recorded_steps.jsonl`` was taken for a recording
    ("already holds a recording": a force=True that would then remove it, a callback's ``DIR-2``)."""
    folder = tmp_path / "r"
    folder.mkdir()
    steps = folder / store.RECORDED_STEPS_FILE
    if kind == "named pipe":
        os.mkfifo(steps)
    elif kind == "hard link":
        (tmp_path / "elsewhere").write_text("")
        os.link(tmp_path / "elsewhere", steps)
    else:
        steps.mkdir()
    with pytest.warns(RuntimeWarning, match=f"not recording into {folder}: {steps}: not a regular file of the folder"):
        recorder = StepRecorder(WrappedHeadLM(), folder, steps=(1,), trace=False, force=True)
    assert _train(recorder) == 3 and recorder.records == []
    assert os.path.lexists(steps) and (tmp_path / "elsewhere").exists() == (kind == "hard link")


def test_a_full_disk_while_storing_a_step_is_a_warning(tmp_path, monkeypatch):
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=(0, 1), trace=False, report=False)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        assert _train(recorder) == 3


@pytest.mark.parametrize("where", ["unwritable", "held"])
def test_the_lightning_callback_warns_and_fit_goes_on(where, request, lightning_callback, tmp_path):
    folder = request.getfixturevalue(where)
    trainer = _Trainer(tmp_path / "logs")
    callback = lightning_callback(steps=(1,), out=folder, trace=False)
    with pytest.warns(RuntimeWarning, match="training goes on"):
        _lightning_fit(callback, WrappedHeadLM(), trainer, steps=3, validate_after={0})
    assert trainer.global_step == 3


@pytest.mark.parametrize("where", ["unwritable", "held"])
def test_the_hf_callback_warns_and_training_goes_on(where, request, hf_callback, tmp_path):
    folder = request.getfixturevalue(where)
    model = WrappedHeadLM()
    args = types.SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback = hf_callback(steps=(1,), out=folder, trace=False)
    with pytest.warns(RuntimeWarning, match="training goes on"):
        callback.on_train_begin(args, state, None, model=model)
        for i in range(3):
            callback.on_step_begin(args, state, None)
            _loss(model, _batch(i)).backward()
            state.global_step += 1
            callback.on_step_end(args, state, None)
        callback.on_train_end(args, state, None)
    assert state.global_step == 3


class _ParametersRaise(WrappedHeadLM):
    def parameters(self, recurse: bool = True):
        raise RuntimeError("parameters() of a model that lists them lazily")


def test_a_model_whose_parameters_raise_is_a_warning_and_training_goes_on(tmp_path):
    """The recorder asked the model's device at the recorded step, unguarded: the user's loop died."""
    model = _ParametersRaise()
    recorder = StepRecorder(model, tmp_path / "r", steps=(1,), trace=False, report=False)
    optimizer = torch.optim.SGD(torch.nn.Module.parameters(model), lr=1e-3)
    with pytest.warns(RuntimeWarning, match=r"step 1 is not recorded: the model's parameters\(\) raised"):
        for i in range(3):
            with recorder.step():
                _loss(model, _batch(i)).backward()
                optimizer.step()
    recorder.close()
    assert recorder.count == 3 and recorder.records == []


@pytest.mark.parametrize("steps, out, fragment", [
    (range(10**9), "r", "more than the 20,000 a folder holds"), (__import__("itertools").count(), "r", "more than the 20,000"),
    (5, "r", "steps must be"), ((2,), "", "out: expected a folder path"), ((2,), 123, "out: expected a folder path"),
    ((2,), b"r", "out: expected a folder path"), ((2,), "a\x00b", "out: a path cannot hold a NUL"),
    ((2,), "o\ud800", "out: a path cannot hold '\\\\ud800'"),
])
def test_recorders_and_callbacks_refuse_bad_arguments_naming_them(tmp_path, lightning_callback, hf_callback, steps,
                                                                  out, fragment):
    """An endless ``steps`` was listed before the limit was checked (out of memory); a callback took
    ``out=""`` for the current folder and raised a bare ``TypeError`` for ``steps=5`` or ``out=123``, and
    took a lone surrogate (which no file system encoding writes) and raised at the start of training."""
    from fusedce_profile.errors import UsageError

    os.chdir(tmp_path)
    for make in (lambda: StepRecorder(WrappedHeadLM(), out, steps=steps), lambda: lightning_callback(steps, out),
                 lambda: hf_callback(steps, out)):
        with pytest.raises(UsageError, match=fragment):
            make()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("option, fragment", [
    ({"label": 123}, "label: expected a line of at most 500 printable characters"), ({"label": "a\nb"}, "label: expected"),
    ({"label": "x" * 501}, "label: expected"), ({"vocab": -5}, "vocab: expected an integer ≥ 1"),
    ({"vocab": True}, "vocab: expected"), ({"fused": "yes"}, "fused: expected True, False or None"),
    ({"head": ""}, "head: expected the LM head's attribute path"),
])
def test_recorders_and_callbacks_refuse_what_their_report_would_refuse(tmp_path, lightning_callback, hf_callback,
                                                                      option, fragment):
    """``label=123`` was stored, then the folder's own report refused the row: the step was lost;
    ``vocab=-5`` was stored and rendered."""
    from fusedce_profile.errors import UsageError

    os.chdir(tmp_path)
    for make in (lambda: StepRecorder(WrappedHeadLM(), "r", **option),
                 lambda: lightning_callback((2,), "r", **option), lambda: hf_callback((2,), "r", **option)):
        with pytest.raises(UsageError, match=fragment):
            make()
    assert os.listdir(tmp_path) == []


def test_a_folder_replaced_by_a_link_mid_run_is_never_written_through(tmp_path):
    """The recorder's folder swapped for a link to another folder between two steps: the next step's
    row was appended to the other folder's ``recorded_steps.jsonl``, then came the warning."""
    import shutil

    folder, elsewhere = tmp_path / "r", tmp_path / "elsewhere"
    elsewhere.mkdir()
    recorder = StepRecorder(WrappedHeadLM(), folder, steps=(0, 2), trace=False)
    model = recorder.model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with pytest.warns(RuntimeWarning, match="writing step 2 .* a symbolic link"):
        for i in range(3):
            if i == 2:
                shutil.move(folder, tmp_path / "moved")
                folder.symlink_to(elsewhere)
            with recorder.step():
                _loss(model, _batch(i)).backward()
                optimizer.step()
                optimizer.zero_grad()
        recorder.close()
    assert list(elsewhere.iterdir()) == [] and [r.step for r in recorder.records] == [0]


def _recording_is_off() -> bool:
    """Tensor.backward is torch's own again and no profiler runs (what a recorded step changed is undone)."""
    return not hasattr(torch.Tensor.backward, "__wrapped__") and not torch.autograd.profiler._is_profiler_enabled


def test_a_lightning_step_that_raises_ends_its_recording_and_releases_the_folder(tmp_path, lightning_callback):
    """Lightning runs ``on_exception`` and no teardown hook after an exception: the callback ends the
    step unrecorded there and releases the folder, so it holds no lock while the process goes on."""
    trainer, model = _Trainer(tmp_path / "logs"), WrappedHeadLM()
    callback = lightning_callback(steps=(0,), out=tmp_path / "rec")
    callback.setup(trainer, model, "fit")
    callback.on_train_batch_start(trainer, model, _batch(0), 0)
    assert callback.recorder.recording and not _recording_is_off()
    callback.on_exception(trainer, model, ValueError("the user's bug in the recorded step"))
    assert _recording_is_off() and not (tmp_path / "rec" / store.LOCK_FILE).exists()


def _recorded(folder) -> list[int]:
    """The step indices stored in ``folder``'s ``recorded_steps.jsonl``."""
    return [record.step for record in load_recorded_steps(folder).records]


def test_a_hugging_face_step_that_raises_ends_at_the_next_train_which_records_on_its_own(tmp_path, hf_callback):
    """``Trainer`` has no exception event: the next ``train()`` with the same callback ends the open step
    (one warning), closes its recorder and records its own steps with a new one."""
    model = WrappedHeadLM()
    args = types.SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback = hf_callback(steps=(0,), trace=False)
    callback.on_train_begin(args, state, None, model=model)
    callback.on_step_begin(args, state, None)  # the step raises here: no further event
    first = callback.recorder
    assert first.recording and not _recording_is_off()
    with pytest.warns(RuntimeWarning, match="step 0 is not recorded: the training loop that began it ended"):
        callback.on_train_begin(args, state, None, model=model)  # the user calls train() again
    assert first.closed and not first.recording and callback.recorder is not first
    callback.on_step_begin(args, state, None)
    _loss(model, _batch(0)).backward()
    callback.on_step_end(args, state, None)
    callback.on_train_end(args, state, None)
    folder = tmp_path / "out" / "fusedce-profile"
    assert _recorded(folder) == [0]  # the first run recorded nothing
    assert not (folder / store.LOCK_FILE).exists() and _recording_is_off()


class _Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class _FailingLM(torch.nn.Module):
    """A language model whose ``fail_at``-th forward raises (the user's bug in a recorded step)."""

    def __init__(self, fail_at: int | None):
        super().__init__()
        self.embed, self.lm_head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64, bias=False)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, input_ids, labels=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("the user's bug in the recorded step")
        logits = self.lm_head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits}


def _hf_train(model, out, scratch):
    """Three steps of a real ``transformers.Trainer`` with a callback recording step 1 into ``out``."""
    transformers = pytest.importorskip("transformers")
    from fusedce_profile.hf import StepRecorderCallback

    args = transformers.TrainingArguments(output_dir=str(scratch / "hf"), max_steps=3, per_device_train_batch_size=4,
                                          report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                                          disable_tqdm=True)
    callback = StepRecorderCallback(steps=(1,), out=out, trace=False, snapshot=False)
    transformers.Trainer(model=model, args=args, train_dataset=_Rows(), callbacks=[callback]).train()
    return callback


def test_a_trainer_step_that_raises_is_ended_once_train_has_ended_and_a_new_trainer_records(tmp_path):
    """A real ``Trainer.train()`` that raises in its recorded step, the exception caught (a notebook, a
    retry loop): the step stayed open for the life of the process — ``Tensor.backward`` wrapped, the
    profiler on (every later backward profiled), the folder locked — and a new Trainer with a new
    callback recorded nothing ("another StepRecorder is recording"). The step knows its
    ``train()``: once that has ended, the process's next backward, or the next recorder, ends it."""
    pytest.importorskip("transformers")
    LM = _FailingLM

    def train(model, out):
        return _hf_train(model, out, tmp_path)

    with pytest.raises(ValueError, match="the user's bug"):
        train(LM(fail_at=2), tmp_path / "first")
    assert not _recording_is_off() and (tmp_path / "first" / store.LOCK_FILE).exists()  # nothing ended it yet
    plain = torch.nn.Linear(4, 4)
    with pytest.warns(RuntimeWarning, match="step 1 is not recorded: the training loop that began it ended"):
        plain(torch.randn(2, 4)).sum().backward()  # the process's next backward, outside that train()
    assert _recording_is_off() and not (tmp_path / "first" / store.LOCK_FILE).exists()

    with pytest.raises(ValueError, match="the user's bug"):
        train(LM(fail_at=2), tmp_path / "second")
    assert not _recording_is_off()
    from fusedce_profiler.instrument.recording.phases import WATCH_S

    time.sleep(3 * WATCH_S)  # the step's watch sees its loop ended
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="step 1 is not recorded: the training loop"):
        plain(torch.randn(2, 4))  # inference only, on another model: the loop's end is seen there too
    assert _recording_is_off() and not (tmp_path / "second" / store.LOCK_FILE).exists()

    with pytest.raises(ValueError, match="the user's bug"):
        train(LM(fail_at=2), tmp_path / "third")
    kept = train(LM(fail_at=None), tmp_path / "retry")  # a new Trainer and callback: the stale step gives way
    assert (tmp_path / "retry" / "recorded_steps.jsonl").is_file() and _recording_is_off()
    assert kept.recorder.loop_alive is None  # a callback kept by the user holds no frame of the ended train()
    assert not (tmp_path / "third" / store.LOCK_FILE).exists()


def test_a_trainer_callback_kept_after_a_train_that_raised_records_the_next_train_beside_the_first(tmp_path):
    """A real ``Trainer`` and one callback: ``train()`` raises after its recorded step (or inside it), the
    exception is caught, and ``train()`` runs again. The second run was recorded nowhere and nothing said
    so (the first run's recorder, never closed, had its step done). Now it is recorded beside the first."""
    transformers = pytest.importorskip("transformers")
    from fusedce_profile.hf import StepRecorderCallback

    for name, fail_at, first_steps in (("after", 4, [1]), ("inside", 2, [])):
        model, out = _FailingLM(fail_at=fail_at), tmp_path / name
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=4, report_to=[],
                                              per_device_train_batch_size=4, save_strategy="no", use_cpu=True,
                                              logging_strategy="no", disable_tqdm=True)
        callback = StepRecorderCallback(steps=(1,), out=out, trace=False, snapshot=False)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Rows(), callbacks=[callback])
        with pytest.raises(ValueError, match="the user's bug"):
            trainer.train()
        model.calls, model.fail_at = 0, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
        said = [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]
        second = out.with_name(f"{name}-2") if first_steps else out
        assert _recorded(second) == [1], (name, said)
        if first_steps:
            assert _recorded(out) == first_steps
            assert any(f"this run is recorded in {second}" in line for line in said), said
        else:
            assert any("step 1 is not recorded: the training loop that began it ended" in line for line in said), said
        assert not (out / store.LOCK_FILE).exists() and not (second / store.LOCK_FILE).exists()
        assert _recording_is_off()


def test_a_new_callback_into_the_folder_of_a_train_that_raised_in_its_step_records_there(tmp_path):
    """The retry's recorder is made (``on_train_begin``) before any hook of the dead step runs: it was
    refused the folder the dead step still held, and the whole retry went unrecorded."""
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="the user's bug"):
        _hf_train(_FailingLM(fail_at=2), tmp_path / "q", tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _hf_train(_FailingLM(fail_at=None), tmp_path / "q", tmp_path)
    said = [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]
    assert len(said) == 1 and "step 1 is not recorded: the training loop that began it ended" in said[0], said
    assert _recorded(tmp_path / "q") == [1] and _recording_is_off()
    assert not (tmp_path / "q" / store.LOCK_FILE).exists()


def test_a_callback_that_appends_to_the_folder_of_a_train_that_raised_after_its_step_records_there(tmp_path):
    """``train()`` raised after its recorded step (no step open); a new callback with ``append=True``
    (what the "already holds a recording" warning suggests) was refused: the dead run's recorder held the
    folder until the process ended."""
    transformers = pytest.importorskip("transformers")
    from fusedce_profile.hf import StepRecorderCallback

    with pytest.raises(ValueError, match="the user's bug"):
        _hf_train(_FailingLM(fail_at=3), tmp_path / "q", tmp_path)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=3, per_device_train_batch_size=4,
                                          report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                                          disable_tqdm=True)
    callback = StepRecorderCallback(steps=(2,), out=tmp_path / "q", append=True, trace=False, snapshot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transformers.Trainer(model=_FailingLM(None), args=args, train_dataset=_Rows(), callbacks=[callback]).train()
    assert not [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]
    assert _recorded(tmp_path / "q") == [1, 2] and _recording_is_off()
    assert not (tmp_path / "q" / store.LOCK_FILE).exists()


def _in_a_train(body):
    """``body()`` called from a function ``train`` of a module named ``transformers.*`` (what the Hugging
    Face callback takes for the ``Trainer.train`` call it runs in)."""
    namespace = {"__name__": "transformers.stand_in"}
    exec("def train(body):\n    return body()\n", namespace)
    return namespace["train"](body)


def test_one_callback_for_two_trainers_running_at_once_says_so_and_ends_the_first_recording(tmp_path, hf_callback):
    """The second ``train()`` ended the first one's live step saying "the training loop that began it
    ended (an exception left it)", which was false."""
    import threading

    model = WrappedHeadLM()
    args = types.SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback = hf_callback(steps=(0,), trace=False)
    began, release = threading.Event(), threading.Event()

    def first_train():
        callback.on_train_begin(args, state, None, model=model)
        callback.on_step_begin(args, state, None)
        began.set()
        release.wait(60)

    first = threading.Thread(target=_in_a_train, args=(first_train,))
    first.start()
    try:
        assert began.wait(60)
        recorder = callback.recorder
        assert recorder.recording
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _in_a_train(lambda: callback.on_train_begin(args, state, None, model=model))
        said = [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]
        assert len(said) == 1 and "recording a train() that still runs" in said[0], said
        assert recorder.closed and callback.recorder is not recorder and _recording_is_off()
    finally:
        release.set()
        first.join(60)
    callback.on_train_end(args, state, None)


def test_recorders_made_and_closed_in_several_threads_at_once_never_raise(tmp_path):
    """Making a recorder lists the process's open recorders (to close orphans) while other threads add and
    remove theirs: "Set changed size during iteration" reached the caller, through a callback its ``fit``."""
    import threading

    model, failures = torch.nn.Linear(4, 4), []
    options = dict(trace=False, snapshot=False, report=False)
    held = [StepRecorder(model, tmp_path / f"held{i}", **options) for i in range(200)]  # a long list to walk
    interval = sys.getswitchinterval()

    def churn(name):
        for i in range(150):
            try:
                StepRecorder(model, tmp_path / f"{name}{i % 20}", force=True, **options).close()
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc))

    sys.setswitchinterval(1e-6)  # thread switches often: the race within a few hundred recorders
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            threads = [threading.Thread(target=churn, args=(name,)) for name in "abc"]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
    finally:
        sys.setswitchinterval(interval)
        for recorder in held:
            recorder.close()
    assert not failures, failures[:3]
    # two recorders probing their common parent for a run's lock at once each saw the other's probe as a run
    assert not [str(w.message) for w in caught if "fusedce-profile" in str(w.message)][:3]


def test_a_recorder_dropped_without_close_gives_its_folder_to_the_next(tmp_path):
    """A recorder dropped without ``close()`` kept its folder from every new recorder of the process."""
    model, options = torch.nn.Linear(4, 4), dict(trace=False, snapshot=False, report=False)
    dropped = StepRecorder(model, tmp_path / "r", **options)
    assert dropped.enabled
    del dropped  # garbage in a reference cycle (its report callback): collected only by the next collection
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = StepRecorder(model, tmp_path / "r", **options)
    assert again.enabled
    again.close()
    assert not (tmp_path / "r" / store.LOCK_FILE).exists()


_DEL_CLOSES = """
import torch
from fusedce_profile import StepRecorder
model = torch.nn.Linear(4, 4)
class Profiled:
    def __init__(self, out):
        self.rec = StepRecorder(model, out, trace=False, snapshot=False, report=False, force=True)
        self.cycle = {"owner": self}  # collected by the cycle collector, whenever it runs
    def __del__(self):
        self.rec.close()
for i in range(3000):
    Profiled(f"t/{i % 50}")
print("done")
"""


def test_a_recorder_closed_from_a_collected_objects_del_never_hangs(tmp_path):
    """A collection run while the process's list of open recorders was being changed ran a ``__del__``
    that closed a recorder: it waited for ever on the lock its own thread held."""
    done = subprocess.run([sys.executable, "-c", _DEL_CLOSES], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


_FORKED = """
import gc, os, torch
from fusedce_profile import StepRecorder
from fusedce_profiler.instrument.runlock import live_holder
model = torch.nn.Linear(4, 4)
rec = StepRecorder(model, "J", trace=False, snapshot=False, report=False)
go, back = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    os.read(go[0], 1)
    rec = StepRecorder(model, "J", trace=False, snapshot=False, report=False, append=True)  # the copy is dropped
    gc.collect()
    os.write(back[1], b"x")
    os.read(go[0], 1)
    rec.close()
    os._exit(0)
rec.close()
os.write(go[1], b"x")
os.read(back[0], 1)
print(live_holder("J") is not None)
os.write(go[1], b"x")
os.waitpid(pid, 0)
"""


def test_a_recorder_copied_into_a_forked_child_never_releases_the_childs_own_lock(tmp_path):
    """The inherited copy's finalizer released the lock the child had taken anew on the same folder: the
    child recorded into a folder every other process saw as free."""
    done = subprocess.run([sys.executable, "-c", _FORKED], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["True"], (done.stdout, done.stderr[-2000:])


def test_a_run_lock_is_taken_while_other_threads_only_check_it(tmp_path):
    """Checks for a live run (a shared lock for a moment) in a tight loop: a run starting then was refused as
    "in use by another process" (3 of 300 starts)."""
    import threading

    from fusedce_profiler.instrument.runlock import RunLock, live_holder

    stop, refused = threading.Event(), []

    def check():
        while not stop.is_set():
            live_holder(tmp_path)

    checkers = [threading.Thread(target=check) for _ in range(2)]
    for thread in checkers:
        thread.start()
    try:
        for _ in range(200):
            try:
                RunLock(tmp_path).acquire().release()
            except store.FolderInUse as exc:
                refused.append(str(exc))
    finally:
        stop.set()
        for thread in checkers:
            thread.join(60)
    assert not refused, refused[:2]


def _train_finding_its_batch_size(tmp_path, *, fail_at: int, step: int, max_steps: int) -> list[str]:
    """One ``train()`` with ``auto_find_batch_size`` whose ``fail_at``-th forward runs out of memory (the
    Trainer begins its loop again at half the batch), recording ``step`` into ``tmp_path/a``; the tool's
    warnings."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from fusedce_profile.hf import StepRecorderCallback

    class OutOfMemoryOnce(_FailingLM):
        def forward(self, input_ids, labels=None):
            if self.calls + 1 == self.fail_at:
                self.calls += 1
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().forward(input_ids, labels)

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=max_steps, report_to=[],
                                          per_device_train_batch_size=8, auto_find_batch_size=True, use_cpu=True,
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback = StepRecorderCallback(steps=(step,), out=tmp_path / "a", trace=False, snapshot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transformers.Trainer(model=OutOfMemoryOnce(fail_at=fail_at), args=args, train_dataset=_Rows(),
                             callbacks=[callback]).train()
    return [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]


def test_a_trainer_that_begins_its_loop_again_inside_one_train_is_not_called_another_trainer(tmp_path):
    """``auto_find_batch_size``: an error in the recorded step, and the Trainer begins its loop again inside
    the same ``train()``: the callback said a train() of another Trainer still ran."""
    said = _train_finding_its_batch_size(tmp_path, fail_at=2, step=1, max_steps=3)
    assert len(said) == 1 and "began its loop again inside the same train()" in said[0], said
    assert _recorded(tmp_path / "a") == [1] and _recording_is_off()


def test_a_trainer_that_begins_again_before_its_recorded_step_says_nothing_and_records_it(tmp_path, capfd):
    """``auto_find_batch_size`` with the error before the recorded step (the first step at the largest batch):
    "step 2 was never reached … nothing was recorded for it" was printed, then the same ``train()`` recorded it."""
    said = _train_finding_its_batch_size(tmp_path, fail_at=1, step=2, max_steps=4)
    assert not said and "never reached" not in capfd.readouterr().err
    assert _recorded(tmp_path / "a") == [2] and _recording_is_off()


def test_an_interrupt_while_a_run_lock_waits_leaves_no_descriptor_and_no_lock(tmp_path, monkeypatch):
    """Ctrl-C during the wait for a lock held only by checks: the folder's descriptor stayed open (with the
    shared lock of the wait on it, every later run in the folder, from any process, was refused)."""
    from fusedce_profiler.instrument import runlock

    def interrupted(fd):
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the wait's own check, then the interrupt
        raise KeyboardInterrupt

    opened = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(runlock, "_lock_exclusive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runlock.RunLock(tmp_path).acquire()
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == opened
    runlock.RunLock(tmp_path).acquire().release()


@pytest.mark.parametrize("where", ["open_own_file", "ftruncate"])
def test_an_interrupt_once_a_run_lock_is_taken_leaves_it_free(tmp_path, monkeypatch, where):
    """Ctrl-C after the lock was taken, before it was recorded (while its note was written): the folder stayed
    locked, with a note naming this process, until the process ended."""
    from fusedce_profiler.instrument import confined, runlock

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    opened = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(confined if where == "open_own_file" else runlock.os, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        runlock.RunLock(tmp_path).acquire()
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == opened and not (tmp_path / store.LOCK_FILE).exists()
    assert runlock.live_holder(tmp_path) is None
    runlock.RunLock(tmp_path).acquire().release()


def _signalled(real, signum=None):
    """``real`` with a signal sent to this process as it is called (a signal arriving at that moment)."""
    import signal

    def call(*args, **kwargs):
        os.kill(os.getpid(), signum or signal.SIGINT)
        return real(*args, **kwargs)

    return call


def _free(folder) -> bool:
    """No lock, note or descriptor of this process left on ``folder``."""
    from fusedce_profiler.instrument import runlock

    descriptors = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}")]
    return (runlock.live_holder(folder) is None and not runlock.RunLock.held_here(folder)
            and not (folder / store.LOCK_FILE).exists() and str(folder) not in descriptors)


@pytest.mark.parametrize("moment", ["acquire", "release"])
def test_a_signal_while_a_run_lock_changes_hands_comes_once_the_lock_is_whole(tmp_path, monkeypatch, moment):
    """Ctrl-C as the lock was recorded as this process's (or as it was forgotten on release): the folder stayed
    locked by a lock nothing could release until the process ended. Signals now wait for the change to be
    whole; one that raises as the lock is taken gives it up."""
    from fusedce_profiler.instrument import folder_identity, runlock

    lock = runlock.RunLock(tmp_path) if moment == "acquire" else runlock.RunLock(tmp_path).acquire()
    monkeypatch.setattr(folder_identity, "note_locked_folder", _signalled(folder_identity.note_locked_folder))
    with pytest.raises(KeyboardInterrupt):
        lock.acquire() if moment == "acquire" else lock.release()
    monkeypatch.undo()
    assert _free(tmp_path)
    runlock.RunLock(tmp_path).acquire().release()


def test_a_signal_while_a_recorder_takes_its_folder_gives_the_folder_up_at_once(tmp_path, monkeypatch):
    """Ctrl-C as a StepRecorder registered itself: the folder stayed locked (until a collection, or the end of
    the process), and a new recorder into it was refused."""
    from fusedce_profiler.instrument.recording import holder

    monkeypatch.setattr(holder, "opened", _signalled(holder.opened))
    with pytest.raises(KeyboardInterrupt):
        StepRecorder(torch.nn.Linear(4, 4), tmp_path / "r", trace=False, snapshot=False, report=False)
    monkeypatch.undo()
    assert _free(tmp_path / "r")
    again = StepRecorder(torch.nn.Linear(4, 4), tmp_path / "r", trace=False, snapshot=False, report=False)
    assert again.enabled
    again.close()


def test_a_watchdogs_timeout_landing_while_a_recorder_takes_its_folder_reaches_the_caller(tmp_path, monkeypatch):
    """A SIGALRM watchdog raising ``TimeoutError`` (an ``OSError``) as the recorder took its folder: read as the
    folder's refusal — "not recording into …: watchdog", the caller never saw it, the folder stayed locked."""
    import signal

    from fusedce_profiler.instrument.recording import holder

    def watchdog(number, frame):
        raise TimeoutError("a watchdog")

    previous = signal.signal(signal.SIGALRM, watchdog)
    monkeypatch.setattr(holder, "opened", _signalled(holder.opened, signal.SIGALRM))
    try:
        with pytest.raises(TimeoutError, match="a watchdog"):
            StepRecorder(torch.nn.Linear(4, 4), tmp_path / "r", trace=False, snapshot=False, report=False)
    finally:
        signal.signal(signal.SIGALRM, previous)
    monkeypatch.undo()
    assert _free(tmp_path / "r")


@pytest.mark.parametrize("raised", [ValueError, FileExistsError])
def test_a_programs_own_error_from_a_held_back_handler_reaches_it_as_it_is(tmp_path, monkeypatch, raised):
    """A watchdog's own ``ValueError`` or ``FileExistsError``, held back while the recorder took its folder:
    turned into ``UsageError`` (a bad argument), or read by a callback as "the folder holds a recording"
    (the run moved to ``DIR-2``, the watchdog's error dropped)."""
    import signal

    from fusedce_profile.recorder import callback_recorder
    from fusedce_profiler.instrument.recording import holder

    class WatchdogError(raised):
        pass

    def watchdog(number, frame):
        raise WatchdogError("the watchdog's own")

    previous = signal.signal(signal.SIGALRM, watchdog)
    monkeypatch.setattr(holder, "opened", _signalled(holder.opened, signal.SIGALRM))
    try:
        with pytest.raises(WatchdogError):
            StepRecorder(torch.nn.Linear(4, 4), tmp_path / "a", trace=False, snapshot=False, report=False)
        with pytest.raises(WatchdogError):
            callback_recorder(torch.nn.Linear(4, 4), tmp_path / "b", (0,), dict(trace=False, snapshot=False))
    finally:
        signal.signal(signal.SIGALRM, previous)
    monkeypatch.undo()
    assert _free(tmp_path / "a") and _free(tmp_path / "b") and not (tmp_path / "b-2").exists()


def test_a_lock_released_is_free_at_once_though_a_copy_of_its_descriptor_lives(tmp_path):
    """A child forked while the folder was locked holds a copy of its descriptor until its fork hook closes it:
    the parent's release, then its next run there, was refused "in use by another process" meanwhile."""
    from fusedce_profiler.instrument import runlock

    lock = runlock.RunLock(tmp_path).acquire()
    copy = os.dup(runlock.RunLock._held[tmp_path.resolve()][0])  # what a child forked now holds
    try:
        lock.release()
        runlock.RunLock(tmp_path).acquire().release()
    finally:
        os.close(copy)


def test_alarms_at_any_moment_of_making_recorders_never_leave_a_folder_held(tmp_path):
    """A handler that raises (an alarm, Ctrl-C) at random moments of ``StepRecorder(...)``: 10 of 186 creations
    left the folder locked, after a collection too."""
    import random
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupted, generator = 0, random.Random(5)
    try:
        for i in range(60):
            # the model made outside the alarm's window: torch's own no_grad (in the layer's initialisation)
            # interrupted at its entry or exit leaves this thread's gradients off for every test after this one
            folder, recorder, model = tmp_path / f"r{i}", None, torch.nn.Linear(4, 4)
            try:
                signal.setitimer(signal.ITIMER_REAL, generator.uniform(0.0002, 0.004))
                recorder = StepRecorder(model, folder, trace=False, snapshot=False, report=False)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            if recorder is not None:
                recorder.close()
            assert not folder.exists() or _free(folder), i
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted >= 5 and torch.is_grad_enabled()  # the alarms did land inside the creations


def test_a_fork_beside_a_thread_taking_run_locks_never_hands_the_child_a_lock(tmp_path):
    """A fork while another thread had a folder's descriptor locked but not yet recorded (or no longer): the
    child kept the folder locked after the parent released it (89 of 100 forks beside a thread that only took
    and released locks)."""
    import fcntl
    import threading

    from fusedce_profiler.instrument import runlock

    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            i += 1
            runlock.RunLock(tmp_path / f"t{i % 8}").acquire().release()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    kept = []
    try:
        for _ in range(40):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: which folders it holds a descriptor of, then wait to be asked
                os.close(read)
                mine = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                        if os.path.exists(f"/proc/self/fd/{fd}")]
                os.write(write, "\n".join(m for m in mine if m.startswith(str(tmp_path) + "/t")).encode())
                os.close(write)
                time.sleep(0.2)
                os._exit(0)
            os.close(write)
            named = os.read(read, 65536).decode().split("\n")
            os.close(read)
            time.sleep(0.02)
            for folder in filter(None, named):
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not runlock.RunLock.held_here(folder):  # locked by the child alone
                        kept.append(folder)
                finally:
                    os.close(fd)
            os.waitpid(pid, 0)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert kept == []


def test_a_forked_child_leaves_its_parents_recorders_to_the_parent(tmp_path):
    """A child forked from a process with an open recorder (a DataLoader worker) ended normally: its exit
    closed the parent's recorder too, saying "step 5 was never reached" a second time."""
    script = (f"import os, sys, torch\nfrom fusedce_profile import StepRecorder\n"
              f"r = StepRecorder(torch.nn.Linear(4, 4), {str(tmp_path / 'r')!r}, steps=(5,), trace=False, "
              f"snapshot=False, report=False)\n"
              f"pid = os.fork()\nif pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\nr.close()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("step 5 was never reached") == 1, done.stderr


def test_a_step_a_forked_child_runs_is_not_recorded_into_its_parents_folder(tmp_path):
    """A training step run in a child forked after the recorder was made: recorded into the parent's folder,
    without its lock, beside the parent's own steps."""
    script = (f"import os, sys, torch\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              f"from fusedce_profile import StepRecorder\nfrom doctor_models import WrappedHeadLM\n"
              f"from test_recording import _batch, _loss\nmodel = WrappedHeadLM()\n"
              f"r = StepRecorder(model, {str(tmp_path / 'r')!r}, steps=(0, 1), trace=False, snapshot=False, "
              f"report=False)\npid = os.fork()\n"
              f"with r.step(0):\n    _loss(model, _batch(0)).backward()\n"
              f"if pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
              f"with r.step(1):\n    _loss(model, _batch(1)).backward()\nr.close()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr
    assert "step 0 is not recorded: this StepRecorder is its parent's" in done.stderr
    assert _recorded(tmp_path / "r") == [0, 1]  # the parent's two steps, once each


def test_close_refuses_a_say_unreached_that_is_not_true_or_false(tmp_path):
    from fusedce_profile import StepRecorder
    from fusedce_profile.errors import UsageError

    recorder = StepRecorder(torch.nn.Linear(4, 4), tmp_path / "r", trace=False, snapshot=False, report=False)
    with pytest.raises(UsageError, match="say_unreached 'no': expected True or False"):
        recorder.close(say_unreached="no")
    recorder.close()


def test_a_closed_recorder_records_nothing_more_and_says_so_once(tmp_path):
    """A notebook cell re-run after the one that closed the recorder: its steps were recorded into the
    folder it had released (also while another recorder held it)."""
    from fusedce_profile import StepRecorder

    model = WrappedHeadLM()
    recorder = StepRecorder(model, tmp_path / "rec", steps=(0, 1), trace=False, snapshot=False, report=False)
    with recorder.step(0):
        _loss(model, _batch(0)).backward()
    recorder.close()
    holder = StepRecorder(model, tmp_path / "rec", steps=(5,), append=True, trace=False, snapshot=False, report=False)
    with pytest.warns(RuntimeWarning, match="step 1 is not recorded: this StepRecorder was closed") as said:
        with recorder.step(1):
            _loss(model, _batch(1)).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with recorder.step(1):  # said once
            _loss(model, _batch(1)).backward()
    assert len([w for w in said if "fusedce-profile" in str(w.message)]) == 1
    assert _recorded(tmp_path / "rec") == [0]
    holder.close()


def test_a_stale_step_of_one_thread_ended_from_another_is_one_warning_and_the_retry_there_records(tmp_path):
    """``train()`` raising in its recorded step in one thread, a retry with a new Trainer in another:
    the retry's first backward ends the stale step. The profiler it ran belongs to the first thread,
    so reading its events from the second failed, and a second warning ("CPU memory replay found
    markers []") came before the one that says why the step is not recorded."""
    import threading
    import warnings

    pytest.importorskip("transformers")

    def first():
        with pytest.raises(ValueError, match="the user's bug"):
            _hf_train(_FailingLM(fail_at=2), tmp_path / "first", tmp_path)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for target, args in [(first, ()), (_hf_train, (_FailingLM(None), tmp_path / "retry", tmp_path))]:
            thread = threading.Thread(target=target, args=args)
            thread.start()
            thread.join(120)
    ours = [str(w.message) for w in caught if str(w.message).startswith("fusedce-profile")]
    assert len(ours) == 1 and "step 1 is not recorded: the training loop that began it ended" in ours[0], ours
    assert (tmp_path / "retry" / "recorded_steps.jsonl").is_file() and _recording_is_off()
    assert not (tmp_path / "first" / store.LOCK_FILE).exists()


def test_a_process_that_exits_inside_a_recorded_step_ends_it_and_leaves_no_lock(tmp_path):
    """A loop that raised out of a recorded step and caught it, then ended: the recorder ends the step
    unrecorded at exit (before the interpreter tears the profiler down) and releases the folder."""
    folder = tmp_path / "rec"
    script = ("import torch\nfrom fusedce_profile import StepRecorder\n"
              f"rec = StepRecorder(torch.nn.Linear(4, 4), {str(folder)!r}, steps=(0,))\n"
              "try:\n    with rec.step():\n        raise ValueError('the user bug')\nexcept ValueError:\n    pass\n"
              "rec2 = StepRecorder(torch.nn.Linear(4, 4), " + repr(str(tmp_path / "rec2")) + ", steps=(0,))\n"
              "rec2.start(0)\nprint('left open', rec2.recording, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "left open True" in done.stdout, done.stderr
    assert not (folder / store.LOCK_FILE).exists() and not (tmp_path / "rec2" / store.LOCK_FILE).exists()


@pytest.mark.parametrize("swapped", ["folder", "parent"])
def test_a_run_folder_moved_mid_run_is_never_written_through_its_path(tmp_path, swapped):
    """A locked folder (or a folder above it) replaced by a link to another folder: appending a row,
    writing a page and recording a step all refuse, and nothing is made in the other folder."""
    from fusedce_profiler.instrument.confined import FolderRefused

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "o").mkdir(parents=True)
    folder = tmp_path / "a" / "o"
    model = WrappedHeadLM()
    recorder = StepRecorder(model, folder, steps=(0, 1), trace=False)
    with recorder.step():
        _loss(model, _batch(0)).backward()
    moved = tmp_path / "a" if swapped == "parent" else folder
    moved.rename(tmp_path / "moved")
    moved.symlink_to(elsewhere if swapped == "parent" else elsewhere / "o")
    with pytest.raises(FolderRefused, match="not the folder this run locked"):
        store.append_jsonl(folder / "results.jsonl", {"row": 1})
    with pytest.raises(FolderRefused, match="not the folder this run locked"):
        store.write_text(folder / "plots" / "page.md", "text")
    with pytest.warns(RuntimeWarning, match="writing step 1"):
        with recorder.step():
            _loss(model, _batch(1)).backward()
    recorder.close()
    assert not any(path.is_file() for path in elsewhere.rglob("*")), sorted(elsewhere.rglob("*"))


def test_a_training_loop_run_in_a_thread_is_seen_alive_from_another_and_ended_once_left():
    """A ``train()`` run in a thread of its own (a UI, a pool), asked about from another thread: alive
    while that thread is inside it, ended once the thread has left it (the probe answered "alive"
    from any other thread, so a step begun there was never found stale)."""
    import threading

    from fusedce_profiler.instrument.recording.holder import loop_probe

    inside, leave, probes = threading.Event(), threading.Event(), []

    def train():
        probes.append(loop_probe(__name__, "train"))
        inside.set()
        leave.wait(30)

    worker = threading.Thread(target=train)
    worker.start()
    assert inside.wait(30)
    assert probes[0] is not None and probes[0]() is True
    leave.set()
    worker.join(30)
    assert probes[0]() is False


def test_the_global_hook_that_ends_a_stale_step_is_added_only_once_its_loop_has_ended():
    """While the loop that began a step runs, no hook is added to every module's call (a compiled
    model's step would break its graph at each); once the loop has ended without ending the step,
    one is, and it goes with the step's other hooks."""
    from torch.nn.modules import module as modules

    from fusedce_profiler.instrument.recording.phases import WATCH_S, StepRecording

    running, ended = [True], []
    rec = StepRecording(0, device=torch.device("cpu"), shape=None, begin=lambda r: None, end=lambda r, ok: None)
    rec.alive, rec.ended_if_stale = (lambda: running[0]), (lambda: ended.append(True) or True)
    before = dict(modules._global_forward_pre_hooks)
    rec._watch_loop()
    time.sleep(3 * WATCH_S)
    assert modules._global_forward_pre_hooks == before
    running[0] = False
    time.sleep(3 * WATCH_S)
    assert len(modules._global_forward_pre_hooks) == len(before) + 1
    torch.nn.Linear(2, 2)(torch.randn(1, 2))  # the next call of any module asks the recorder to end the step
    assert ended

    def warned_as_error():  # python -W error: the recorder's warning raised, after it ended the step
        ended.append(True)
        raise RuntimeWarning("fusedce-profile: step 0 is not recorded")

    rec.ended_if_stale = warned_as_error
    assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).shape == (1, 2) and len(ended) == 2  # the user's call goes on
    rec.remove_hooks()
    assert modules._global_forward_pre_hooks == before


def _python_with_stderr_full(code: str, *flags: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose standard error is ``/dev/full`` (every write fails: no space)."""
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, *flags, "-c", code], stdout=subprocess.PIPE, stderr=full, text=True,
                              timeout=120)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_recorder_whose_standard_error_cannot_be_written_still_closes_and_training_goes_on(tmp_path, held):
    """``close()`` said the steps never reached with a bare ``print`` (``OSError``: no space left, or
    ``BrokenPipeError`` under a ``| tee`` that ended), out of the callbacks' end of training; under ``-W error``
    the recorder's refusal of a held folder went to standard error the same way, out of ``StepRecorder(...)``."""
    unreached = ("import torch; from fusedce_profile import StepRecorder; "
                 f"r = StepRecorder(torch.nn.Linear(4, 4), {str(tmp_path / 'r')!r}, steps=(5,), trace=False, "
                 "snapshot=False, report=False)\nwith r.step(): pass\nr.close(); print('closed', r.enabled)")
    assert _python_with_stderr_full(unreached).stdout.split() == ["closed", "True"]
    refused = ("import torch; from fusedce_profile import StepRecorder; "
               f"r = StepRecorder(torch.nn.Linear(4, 4), {str(held)!r}, trace=False, snapshot=False, report=False); "
               "r.close(); print('made', r.enabled)")
    assert _python_with_stderr_full(refused, "-W", "error").stdout.split() == ["made", "False"]


def test_a_relative_folder_once_the_current_folder_is_gone_is_a_warning(tmp_path, monkeypatch):
    """``StepRecorder(model, "runs/mine")`` in a process whose current folder was removed raised
    ``FileNotFoundError`` out of the constructor (making the folder absolute asks for the current one)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.warns(RuntimeWarning, match=r"not recording into runs/mine: .*training goes on unrecorded"):
        recorder = StepRecorder(torch.nn.Linear(4, 4), "runs/mine", trace=False, snapshot=False, report=False)
    assert not recorder.enabled
    recorder.close()
