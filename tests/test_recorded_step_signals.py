"""A signal landing as a recorded step begins: Ctrl-C, or a handler of the program's that closes the
recorder (a graceful shutdown), before or after the step is the recorder's active one. Whatever lands
there, the step ends unrecorded, nothing of the recording outlives it (no wrapped ``Tensor.backward``,
no profiler), and the next recorder of the process records."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from fusedce_profile import StepRecorder
from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.instrument.recording import beginning, holder, phases, recorder as recorder_module
from test_recording import _batch, _loss
from test_recording_faults import _free, _recording_is_off, _signalled
from tests.doctor_models import WrappedHeadLM

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

MOMENTS = {  # where in the step's start the signal lands: before the step is the active one, and after
    "measuring the parameters": (beginning, "tensor_bytes"),
    "installing the hooks": (phases.StepRecording, "install"),
    "having taken the recording": (holder, "take"),  # as take returns: the signal comes after the call
    "entering the meter": (MemoryMeter, "__enter__"),  # the profiler starts after the handler has run
}


def _landing(moment: str, signum: int):
    """The function of ``MOMENTS[moment]`` with ``signum`` sent to this process as it is called (as it
    returns, for the taking of the recording)."""
    owner, name = MOMENTS[moment]
    real = getattr(owner, name)
    if moment != "having taken the recording":
        return _signalled(real, signum)

    def taken(*args, **kwargs):
        got = real(*args, **kwargs)
        os.kill(os.getpid(), signum)
        return got

    return taken


def _recorder(folder) -> StepRecorder:
    return StepRecorder(WrappedHeadLM(), folder, steps=(0,), trace=False, snapshot=False, report=False)


def _one_step(recorder) -> None:
    with recorder.step():
        _loss(recorder.model, _batch(0)).backward()


def _records_again(folder) -> bool:
    """A new recorder of this process, into ``folder``, records its step."""
    again = _recorder(folder)
    _one_step(again)
    again.close()
    return [record.step for record in again.records] == [0]


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_as_a_step_begins_leaves_the_process_free_to_record(tmp_path, monkeypatch, moment):
    """The interrupt reached the caller, who closed the recorder (a notebook cell stopped, then run again):
    the process's one recording stayed held, and no recorder of the process recorded again (also, once that
    was mended, with the signal landing as the recording was taken, before the step's start)."""
    recorder = _recorder(tmp_path / "first")
    monkeypatch.setattr(*MOMENTS[moment], _landing(moment, signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        _one_step(recorder)
    monkeypatch.undo()
    assert not holder.holds(recorder)  # given back by the step itself, not only by a close() that may not come
    recorder.close()
    assert _recording_is_off() and recorder.records == [] and _free(tmp_path / "first")
    assert _records_again(tmp_path / "second")


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_handler_that_closes_the_recorder_as_a_step_begins_stops_everything_the_step_began(tmp_path, monkeypatch,
                                                                                            moment):
    """A graceful-shutdown handler closed the recorder while its step began; the step's start then went on
    and started the profiler (and wrapped ``Tensor.backward``) for a recorder already closed: on for the
    rest of the process, its memory growing with every step."""
    recorder = _recorder(tmp_path / "first")
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: recorder.close())
    monkeypatch.setattr(*MOMENTS[moment], _landing(moment, signal.SIGUSR1))
    try:
        _one_step(recorder)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    monkeypatch.undo()
    assert recorder.closed and recorder.records == [] and _recording_is_off() and _free(tmp_path / "first")
    assert _records_again(tmp_path / "second")


def test_a_recorder_collected_while_it_holds_the_recording_holds_nothing(tmp_path):
    """The process's one recording names its holder by a weak reference: a holder gone without giving it
    back (collected mid-step) holds nothing, and the next recorder records."""
    class Gone:
        pass

    gone = Gone()
    assert holder.take(gone)
    del gone
    assert _records_again(tmp_path / "next") and os.listdir(tmp_path / "next")


def test_a_recorder_nothing_holds_frees_its_folder_without_a_collection(tmp_path):
    """A signal landing as ``StepRecorder(...)`` returns leaves a recorder the caller never got: it held its own
    bound method (the report's renderer), a cycle, so its folder stayed locked until a garbage collection
    (2 of 1200 alarms at random moments of making recorders)."""
    import gc
    import weakref

    collecting = gc.isenabled()
    gc.disable()
    try:
        made = _recorder(tmp_path / "r")
        dropped = weakref.ref(made)
        del made
        assert dropped() is None and _free(tmp_path / "r")
    finally:
        if collecting:
            gc.enable()


def test_one_recorder_used_by_two_threads_at_once_records_one_step():
    """A recorder's ``weakref.ref`` is one cached object, so the same recorder taking the recording from a
    second thread found it "already its own" and both steps ran recorded: a crash, or ``Tensor.backward``
    left wrapped. Each taking is its own now: the second is refused."""
    class Recorder:
        def stale(self):
            return False

    import threading

    shared, taken = Recorder(), []
    assert holder.take(shared)
    second = threading.Thread(target=lambda: taken.append(holder.take(shared)))
    second.start()
    second.join()
    assert taken == [False] and holder.holds(shared)
    holder.release(shared)
    assert not holder.holds(shared) and holder.take(shared)
    holder.release(shared)


def test_a_mark_before_the_step_measures_anything_is_ignored():
    """Another thread's ``backward()`` or optimizer step while a recorded step was starting reached the
    hooks before the meter existed: ``AttributeError: 'NoneType' object has no attribute 'mark'`` in that
    thread's training loop."""
    step = phases.StepRecording(0, device=torch.device("cpu"), shape=None, begin=lambda rec: None,
                                end=lambda rec, ok: None)
    step.mark("backward")
    assert step.marked == []


def test_a_handler_that_closes_the_recorder_while_a_step_is_written_lets_it_be_written_then_releases(tmp_path,
                                                                                                   monkeypatch):
    """``close()`` from a signal's handler while a finished step was being written released the folder's lock
    and removed ``.lock``, then the step's row, environment and report were written into the folder anyway
    (a new owner's fresh recording got them); landing earlier, it ended the step a second time: the row
    written, and a warning that the step was not recorded (that case, re-entering the end of a step as its
    hooks were removed, hung the process in the profiler's second stop: not run here, where a regression
    would hang the suite; ``_end`` runs once)."""
    import warnings

    from fusedce_profiler.instrument import store

    recorder, locked_as_written = _recorder(tmp_path / "r"), []
    append = recorder_module.append_recorded_step

    def appended(folder, *args):  # whether the folder was still this run's as its row was written
        locked_as_written.append((folder / store.LOCK_FILE).exists())
        return append(folder, *args)

    monkeypatch.setattr(recorder_module, "append_recorded_step", appended)
    real, sent = recorder_module.append_recorded_step, []

    def signalled_once(*args, **kwargs):  # the handler's own close() ends through the same call
        if not sent:
            sent.append(signal.SIGUSR1)  # first: the handler runs as the kill returns
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(*args, **kwargs)

    monkeypatch.setattr(recorder_module, "append_recorded_step", signalled_once)
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: recorder.close())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _one_step(recorder)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    monkeypatch.undo()
    assert [record.step for record in recorder.records] == [0] and recorder.closed and _free(tmp_path / "r")
    assert locked_as_written == [True] and not [w for w in caught if "not recorded" in str(w.message)]


def test_a_handler_that_closes_the_recorder_then_raises_as_the_step_ends_runs_once_the_step_is_written(tmp_path,
                                                                                                    monkeypatch):
    """A handler that closed the recorder and then raised (Ctrl-C after a graceful close) while the step was
    being ended: the close, waiting for the step's end, ended nothing, and the exception left the step open —
    the profiler on, and a later ``close()`` wrote the step into the released folder. The signal is held back
    while the step ends: the step is written once, then the handler closes the recorder and its exception goes on."""
    recorder = _recorder(tmp_path / "r")
    real, sent = phases.StepRecording.remove_hooks, []

    def signalled_once(*args, **kwargs):
        if not sent:
            sent.append(signal.SIGUSR1)  # first: the handler runs as the kill returns
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(*args, **kwargs)

    def close_then_stop(number, frame):
        recorder.close()
        raise KeyboardInterrupt

    monkeypatch.setattr(phases.StepRecording, "remove_hooks", signalled_once)
    previous = signal.signal(signal.SIGUSR1, close_then_stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            _one_step(recorder)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    monkeypatch.undo()
    assert recorder.closed and _recording_is_off() and [record.step for record in recorder.records] == [0]
    recorder.close()
    assert _free(tmp_path / "r") and not holder.holds(recorder)
    assert len((tmp_path / "r" / "recorded_steps.jsonl").read_text().splitlines()) == 1


def _bad_batch(*args, **kwargs):
    raise RuntimeError("a bad batch")


@pytest.mark.parametrize("ending", ["finished", "its body raised", "its start raised"])
def test_ctrl_c_as_a_step_gives_the_recording_back_leaves_the_process_free_to_record(tmp_path, monkeypatch, ending):
    """Ctrl-C landing as a step that had let go of the recording was giving it back (a loop that catches the
    interrupt and goes on, a notebook cell run again): no recorder of the process recorded again, the same
    one included, until that recorder was closed. (Held back as the step ends: a finished step is written first.)"""
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "first", steps=(0, 1), trace=False, snapshot=False,
                            report=False)
    real, sent = holder.release, []

    def signalled_once(*args, **kwargs):
        if not sent and recorder._active is None:  # the step has let go of it: only the giving back is left
            sent.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(holder, "release", signalled_once)
    if ending == "its start raised":
        monkeypatch.setattr(beginning, "tensor_bytes", _bad_batch)
    with pytest.raises(KeyboardInterrupt):
        with recorder.step():
            _loss(recorder.model, _batch(0)).backward()
            if ending == "its body raised":
                _bad_batch()
    monkeypatch.undo()
    assert sent and not holder.holds(recorder)
    _one_step(recorder)  # the loop goes on: its next requested step is recorded
    assert [record.step for record in recorder.records] == ([0, 1] if ending == "finished" else [1])
    assert _records_again(tmp_path / "second")
    recorder.close()
    assert _recording_is_off() and _free(tmp_path / "first")


def test_ctrl_c_as_close_hands_the_folder_back_leaves_it_to_the_next_close(tmp_path, monkeypatch):
    """The recorder forgot its folder's lock before releasing it: Ctrl-C landing at the release's call left the
    folder locked after every later ``close()``, until a garbage collection or the process's end."""
    from fusedce_profiler.instrument.runlock import RunLock

    recorder = _recorder(tmp_path / "r")
    monkeypatch.setattr(RunLock, "release", _signalled(RunLock.release, signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        recorder.close()
    monkeypatch.undo()
    assert not _free(tmp_path / "r")
    recorder.close()
    assert _free(tmp_path / "r")


def test_ctrl_c_right_after_backward_is_wrapped_leaves_torch_s_own_backward(tmp_path, monkeypatch):
    """The wrapper was noted only after it replaced ``Tensor.backward``: Ctrl-C landing between the two left it
    wrapped for the life of the process (and the model held by it)."""
    sent = []

    def set_then_signal(owner, name, value):
        setattr(owner, name, value)
        if not sent and hasattr(value, "__wrapped__"):  # the step's wrapper is in place
            sent.append(name)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(phases, "setattr", set_then_signal, raising=False)
    recorder = _recorder(tmp_path / "r")
    with pytest.raises(KeyboardInterrupt):
        _one_step(recorder)
    monkeypatch.undo()
    recorder.close()
    assert sent == ["backward"] and _recording_is_off()
    assert not hasattr(torch.autograd.backward, "__wrapped__") and _free(tmp_path / "r")


@pytest.mark.parametrize("form", ["with", "start and finish"])
def test_ctrl_c_as_a_step_is_left_ends_it_unrecorded_at_the_next_step(tmp_path, monkeypatch, form):
    """Ctrl-C landing at the entry of the step's ``__exit__`` (or of ``finish()``), before any of its code, the
    loop going on: the step stayed open for good — profiler on, ``Tensor.backward`` wrapped, the process's
    recording held, this recorder's later steps silently unrecorded — and ``close()`` wrote it as a step
    measured across every later one."""
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=(0, 1), trace=False, snapshot=False,
                            report=False)
    owner, name = (phases.StepRecording, "__exit__") if form == "with" else (StepRecorder, "finish")
    monkeypatch.setattr(owner, name, _signalled(getattr(owner, name), signal.SIGINT))

    def step(index):
        if form == "with":
            with recorder.step(index):
                _loss(recorder.model, _batch(index)).backward()
        else:
            recorder.start(index)
            _loss(recorder.model, _batch(index)).backward()
            recorder.finish()

    with pytest.raises(KeyboardInterrupt):
        step(0)
    monkeypatch.undo()
    assert recorder.recording  # nothing can run at a function's entry: the next step ends it
    with pytest.warns(RuntimeWarning,
                      match="step 0 is not recorded: it was still open as this thread.s next step began"):
        step(1)
    assert _recording_is_off() and not holder.holds(recorder)
    assert [record.step for record in recorder.records] == [1]
    recorder.close()
    assert _free(tmp_path / "r") and _records_again(tmp_path / "other")


def test_a_step_left_open_is_ended_when_this_thread_s_next_step_is_another_recorder_s(tmp_path, monkeypatch):
    """The cut step was ended only at its own recorder's next step: a step of another recorder in the same thread
    was refused ("another StepRecorder is recording"), the cut step's profiler on all through it, and the first
    recorder's ``close()`` wrote the cut step as measured across the other's."""
    first = _recorder(tmp_path / "first")
    monkeypatch.setattr(phases.StepRecording, "__exit__", _signalled(phases.StepRecording.__exit__, signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        _one_step(first)
    monkeypatch.undo()
    with pytest.warns(RuntimeWarning, match="step 0 is not recorded: it was still open"):
        assert _records_again(tmp_path / "second")
    first.close()
    assert first.records == [] and not (tmp_path / "first" / "recorded_steps.jsonl").exists()
    assert _recording_is_off() and _free(tmp_path / "first")


def test_a_step_asked_from_another_thread_while_one_records_is_said_not_recorded(tmp_path):
    """The second thread's requested step was dropped without a word, and missing from the closing lines."""
    import threading

    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=(0, 1), trace=False, snapshot=False,
                            report=False)
    said = []
    with recorder.step(0):
        _loss(recorder.model, _batch(0)).backward()

        def other():
            import warnings

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert recorder.step(1) is recorder_module.NOOP
            said.extend(str(w.message) for w in caught)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    recorder.close()
    assert said == ["fusedce-profile: step 1 is not recorded: this StepRecorder was recording step 0 (one step at "
                    "a time)"]
    assert [record.step for record in recorder.records] == [0] and recorder.unreached() == []


_FIRST_TRACED_STEP = """
import gc, weakref, torch
from fusedce_profile import StepRecorder
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 32))
recorder = StepRecorder(model, {folder!r}, steps=(0,), trace=True, snapshot=False, report=False)
with recorder.step():
    torch.nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 32, (4,))).backward()
recorder.close()
kept = weakref.ref(model)
del model, recorder
gc.collect()
print("model kept:", kept() is not None)
"""


def test_the_first_traced_step_of_a_process_keeps_no_model_alive(tmp_path):
    """The profiler's first start imports ``torch._dynamo``, which keeps what ``Tensor.backward`` is then: the
    step's wrapper, and through it the model, for the life of the process."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_TRACED_STEP.format(folder=str(tmp_path / "r"))],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1:] == ["model kept: False"], (done.stdout, done.stderr[-2000:])


def test_asking_whether_a_step_would_be_recorded_from_another_thread_changes_nothing(tmp_path):
    """``wants()`` is a question: asked from another thread while a step records, it marked the step asked about
    as not recorded, so that step, when it came, was not recorded."""
    import threading

    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=(0, 1), trace=False, snapshot=False,
                            report=False)
    answers = []
    with recorder.step(0):
        asking = threading.Thread(target=lambda: answers.append(recorder.wants(1)))
        asking.start()
        asking.join()
        _loss(recorder.model, _batch(0)).backward()
    with recorder.step(1):
        _loss(recorder.model, _batch(1)).backward()
    recorder.close()
    assert answers == [False] and [record.step for record in recorder.records] == [0, 1]


def test_a_handler_that_records_a_step_as_this_thread_s_step_starts_leaves_that_step_its_recording(tmp_path,
                                                                                                   monkeypatch):
    """A handler running a recorded step of another recorder, landing as this thread's step was being started
    (the recording taken, the step not yet the active one), took the recording from it: the step ran without it,
    so a third recorder could record at the same time (a crash). The handler's step is refused now."""
    first, second = _recorder(tmp_path / "first"), _recorder(tmp_path / "second")

    def record_in_handler(number, frame):
        _one_step(second)

    monkeypatch.setattr(MemoryMeter, "__enter__", _signalled(MemoryMeter.__enter__, signal.SIGUSR1))
    previous = signal.signal(signal.SIGUSR1, record_in_handler)
    try:
        with pytest.warns(RuntimeWarning, match="another StepRecorder is recording a step"):
            with first.step():
                monkeypatch.undo()
                assert holder.holds(first)
                _loss(first.model, _batch(0)).backward()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not holder.holds(first)  # given back as the step ended (its measurement, cut by the handler's own
    first.close()                   # backward, is lost: docs/run-folders.md)
    second.close()
    assert second.records == [] and _recording_is_off() and _free(tmp_path / "first") and _free(tmp_path / "second")


def test_ctrl_c_as_the_head_is_probed_leaves_gradients_on_and_the_next_step_recorded(tmp_path):
    """A recorder's first step finds the head by calling it on a probe under ``torch.no_grad``, whose entry runs
    Python: a Ctrl-C landing there, caught by the loop (a notebook's interrupt), left gradients off in that thread
    for good — every later ``backward()`` raised "does not require grad" — and the head search was never made
    again. The landing is chosen exactly: as ``no_grad`` has just switched gradients off."""
    import sys

    model = WrappedHeadLM()
    recorder = StepRecorder(model, tmp_path / "r", steps=(0, 1), trace=False, snapshot=False, report=False)
    fired = []

    def land(frame, event, arg):
        if event == "c_return" and getattr(arg, "__name__", "") == "_set_grad_enabled" and not fired:
            sys.setprofile(None)
            fired.append(frame.f_code.co_name)
            signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        sys.setprofile(land)
        try:
            with recorder.step(0):
                _loss(model, _batch(0)).backward()
        finally:
            sys.setprofile(None)
    grad_on = torch.is_grad_enabled()
    torch.set_grad_enabled(True)  # whatever happened, the tests after this one train
    with recorder.step(1):
        _loss(model, _batch(1)).backward()
    recorder.close()
    assert fired and grad_on
    assert [r.step for r in recorder.records] == [1] and recorder._head is not None and _recording_is_off()


def _watchdog(number, frame):
    raise TimeoutError("watchdog")


def _step_under_watchdog(recorder) -> None:
    """One step with a watchdog's handler for ``SIGALRM``: its ``TimeoutError`` must reach this caller."""
    previous = signal.signal(signal.SIGALRM, _watchdog)
    try:
        with pytest.raises(TimeoutError, match="watchdog"):
            _one_step(recorder)
    finally:
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("moment", [*MOMENTS, "probing the head"])
def test_a_watchdogs_timeout_as_a_step_begins_reaches_the_program_and_the_next_step_records(tmp_path, monkeypatch,
                                                                                             moment):
    """A program's ``SIGALRM`` handler raising ``TimeoutError`` (a watchdog) as a recorded step began: the recorder
    took it for its own failure ("step 0 is not recorded: TimeoutError: watchdog") and the watchdog never fired;
    landing in the head search, it also kept the head from ever being found."""
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=(0, 1), trace=False, snapshot=False, report=False)
    if moment == "probing the head":
        monkeypatch.setattr(beginning, "find_head", _signalled(beginning.find_head, signal.SIGALRM))
    else:
        monkeypatch.setattr(*MOMENTS[moment], _landing(moment, signal.SIGALRM))
    _step_under_watchdog(recorder)
    monkeypatch.undo()
    assert not recorder.recording and _recording_is_off()
    with recorder.step(1):
        _loss(recorder.model, _batch(1)).backward()
    recorder.close()
    assert [record.step for record in recorder.records] == [1] and recorder._head is not None


def test_a_watchdogs_timeout_as_a_step_is_written_reaches_the_program_once_the_step_is_written(tmp_path, monkeypatch):
    """The same watchdog landing as the step was written: "writing step 0 … failed: watchdog", the step lost and the
    program never told."""
    recorder = _recorder(tmp_path / "r")
    monkeypatch.setattr(recorder_module, "append_recorded_step",
                        _signalled(recorder_module.append_recorded_step, signal.SIGALRM))
    _step_under_watchdog(recorder)
    monkeypatch.undo()
    recorder.close()
    assert [record.step for record in recorder.records] == [0] and _recording_is_off() and _free(tmp_path / "r")


def test_ctrl_c_while_after_record_runs_is_not_held_back_and_the_step_stays_written(tmp_path):
    """The step's end held signals back until ``after_record`` returned: a report of seconds (a subclass's of any
    length) made Ctrl-C wait for it."""
    reached = []

    class SlowAfter(StepRecorder):
        def after_record(self, folder):
            signal.raise_signal(signal.SIGINT)
            reached.append("after the interrupt")

    recorder = SlowAfter(WrappedHeadLM(), tmp_path / "r", steps=(0,), trace=False, snapshot=False)
    with pytest.raises(KeyboardInterrupt):
        _one_step(recorder)
    recorder.close()
    assert reached == [] and [record.step for record in recorder.records] == [0] and _recording_is_off()
    assert _free(tmp_path / "r")


def _begun_with_an_interrupt_at_a_release(recorder, event: str, form: str, nth: int) -> bool:
    """Step ``nth`` (a forward and backward) with a real SIGINT raised at ``event`` of the ``nth`` release of a lock in ``start()`` or the
    step's start (``_begin``): ``"c_return"`` (as the release returns) or ``"c_call"`` (inside a profile hook as it
    is called, where the handler's exception stops the call: only the start's own release runs under a traced
    step's profiler). Whether there was an ``nth``; if so, the ``KeyboardInterrupt`` must have reached this caller."""
    import sys

    where = ("_begin", "start") if event == "c_return" else ("_begin",)

    seen, fired = [0], []

    def hook(frame, hook_event, arg):
        if (hook_event == event and frame.f_code.co_name in where
                and getattr(arg, "__name__", "") == "__exit__"):
            seen[0] += 1
            if seen[0] == nth + 1:
                sys.setprofile(None)
                fired.append(True)
                signal.raise_signal(signal.SIGINT)  # its handler runs at the next check: here, inside the hook
    interrupted = False
    try:
        sys.setprofile(hook)
        try:
            if form == "with":
                with recorder.step(nth):
                    _loss(recorder.model, _batch(nth)).backward()
            else:
                recorder.start(nth)
                _loss(recorder.model, _batch(nth)).backward()
                recorder.finish()
        finally:
            sys.setprofile(None)
    except KeyboardInterrupt:
        interrupted = True
    assert interrupted == bool(fired)
    return bool(fired)


def _every_release_interrupted(tmp_path, event: str, form: str) -> None:
    """At each release in turn: afterwards nothing begun is left open and the lock is free; the next step records."""
    recorder = StepRecorder(WrappedHeadLM(), tmp_path / "r", steps=range(20), trace=False, snapshot=False,
                            report=False)
    nth = 0
    while _begun_with_an_interrupt_at_a_release(recorder, event, form, nth):
        assert not recorder._serial._is_owned() and not recorder.recording and _recording_is_off(), nth
        assert not holder.holds(recorder), nth
        nth += 1
    recorder.close()  # the step of the last call, where no release was left to interrupt, recorded
    assert nth >= 1 and [record.step for record in recorder.records] == [nth] and _free(tmp_path / "r")


@pytest.mark.parametrize("form", ["with", "start"])
def test_ctrl_c_as_a_steps_start_returns_ends_the_step_at_once(tmp_path, form):
    """A Ctrl-C landing as the step's start gave its lock back (the return of the release: the start's own, or
    ``start()``'s around it) left the step begun and open — the profiler on, ``Tensor.backward`` wrapped, the
    recording held — until this thread's next step."""
    _every_release_interrupted(tmp_path, "c_return", form)


@pytest.mark.parametrize("form", ["with", "start"])
def test_a_handler_run_by_a_profilers_hook_as_a_step_begins_leaves_the_lock_free(tmp_path, form):
    """Under a traced step's profiler, a signal's handler may run inside the profiler's hook as a C function is called;
    its exception then stops that call. Landing at the call giving the recorder's lock back as the step's start ended,
    it kept the lock for good: every other thread's step waited (a storm of interrupts with ``trace=True`` left it
    held in 3 of 6 runs). A profile function plays the hook."""
    _every_release_interrupted(tmp_path, "c_call", form)
