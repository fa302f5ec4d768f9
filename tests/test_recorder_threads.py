"""One recorder used from several threads: a step's start, end and write, ``finish()`` and ``close()`` are each
whole before another thread's can begin, so a step is recorded once, never dropped without a word, and never
left open because its end came while another thread's step was being written."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings

import pytest

from fusedce_profile import StepRecorder
from fusedce_profiler.instrument.protocol import MemoryMeter
from fusedce_profiler.instrument.recording import holder, recorder as recorder_module
from test_recording import _batch, _loss
from test_recording_faults import _free, _recorded, _recording_is_off
from tests.doctor_models import WrappedHeadLM

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

WAIT_S = 20.0  # what a test thread waits for another at most (a stuck test fails, it does not hang)


def _recorder(folder, steps=(0, 1)) -> StepRecorder:
    return StepRecorder(WrappedHeadLM(), folder, steps=steps, trace=False, snapshot=False, report=False)


def _train(recorder, index) -> None:
    _loss(recorder.model, _batch(index)).backward()


class _Said:
    """The fusedce warnings each thread was given (``warnings.catch_warnings`` is not thread-safe: one
    ``showwarning`` for the whole test, by thread name)."""

    def __init__(self, monkeypatch) -> None:
        self.by_thread: dict[str, list[str]] = {}
        monkeypatch.setattr(warnings, "showwarning", self._show)
        warnings.simplefilter("always")

    def _show(self, message, *args, **kwargs) -> None:
        if "fusedce" in str(message):
            self.by_thread.setdefault(threading.current_thread().name, []).append(str(message))


def test_a_step_asked_for_while_another_thread_starts_one_waits_for_that_start(tmp_path, monkeypatch):
    """Thread B asked for a step while A's was being started (its head being located): B's start raced A's, each
    saw no step active, and what followed depended on where the switch came (a step recorded twice, one dropped
    without a word, or the recording given away). B now waits for A's start, then is told it is not recorded."""
    said = _Said(monkeypatch)
    recorder, locating, go = _recorder(tmp_path / "r"), threading.Event(), threading.Event()
    real_locate = recorder_module.StepRecorder._locate

    def slow_locate(self):
        if threading.current_thread().name == "A":
            locating.set()
            go.wait(WAIT_S)
        return real_locate(self)

    monkeypatch.setattr(recorder_module.StepRecorder, "_locate", slow_locate)
    got = {}

    def a():
        with recorder.step(0):
            _train(recorder, 0)

    def b_asks():
        got["b"] = recorder.step(1)
    a_thread = threading.Thread(target=a, name="A")
    b = threading.Thread(target=b_asks, name="B")
    a_thread.start()
    assert locating.wait(WAIT_S)
    b.start()
    time.sleep(0.3)
    got["b_waited"] = b.is_alive()
    go.set()
    a_thread.join(WAIT_S)
    b.join(WAIT_S)
    recorder.close()
    assert got["b_waited"] and got["b"] is recorder_module.NOOP
    assert said.by_thread.get("B") == ["fusedce-profile: step 1 is not recorded: this StepRecorder was recording "
                                       "step 0 (one step at a time)"]
    assert [r.step for r in recorder.records] == [0] and _recording_is_off() and _free(tmp_path / "r")


@pytest.mark.parametrize("form", ["with", "start"])
def test_a_step_that_ends_while_another_thread_s_is_written_is_ended_and_written(tmp_path, monkeypatch, form):
    """Thread B's step 0 was being written (its report rendered) when thread C ran step 1: C's end was ignored
    (the recorder was "ending" B's), so step 1 stayed open — profiler on, ``Tensor.backward`` wrapped, the
    recording held — until a later warning or close() wrote it with the wrong measurement."""
    said = _Said(monkeypatch)
    recorder, writing, go = _recorder(tmp_path / "r"), threading.Event(), threading.Event()

    def slow_write(folder):
        if threading.current_thread().name == "B":
            writing.set()
            go.wait(WAIT_S)

    recorder.after_record = slow_write

    def b():
        with recorder.step(0):
            _train(recorder, 0)

    def c():
        if form == "with":
            with recorder.step(1):
                _train(recorder, 1)
        else:
            recorder.start(1)
            _train(recorder, 1)
            recorder.finish()
    b_thread, c_thread = threading.Thread(target=b, name="B"), threading.Thread(target=c, name="C")
    b_thread.start()
    assert writing.wait(WAIT_S)
    c_thread.start()
    time.sleep(0.3)
    go.set()
    b_thread.join(WAIT_S)
    c_thread.join(WAIT_S)
    open_after = recorder.recording or holder.holds(recorder) or not _recording_is_off()
    recorder.close()
    assert not open_after and said.by_thread == {}
    assert sorted(r.step for r in recorder.records) == [0, 1] and _free(tmp_path / "r")


def test_finish_from_another_thread_leaves_that_thread_s_step(tmp_path, monkeypatch):
    """A ``finish()`` from thread B ended the step thread A had started (reading A's measurement from B, and
    with tracing a crash at exit); A's own ``finish()`` then found nothing."""
    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r")
    recorder.start(0)
    got = {}

    def b():
        recorder.start(1)  # refused: A's step is recording
        got["b_finish"] = recorder.finish()
    b_thread = threading.Thread(target=b, name="B")
    b_thread.start()
    b_thread.join(WAIT_S)
    _train(recorder, 0)
    record = recorder.finish()
    recorder.close()
    assert got["b_finish"] is None and record is not None and record.step == 0
    assert said.by_thread["B"] == [
        "fusedce-profile: step 1 is not recorded: this StepRecorder was recording step 0 (one step at a time)",
        "fusedce-profile: finish() is not for step 0: another thread began it and ends it"]
    assert [r.step for r in recorder.records] == [0] and _recording_is_off() and _free(tmp_path / "r")


def test_one_step_asked_for_by_two_threads_is_recorded_once(tmp_path, monkeypatch):
    """Thread B was given step 0's context, and before it entered it the main thread recorded step 0: B's entry
    then recorded step 0 a second time (rows [0, 0])."""
    said = _Said(monkeypatch)
    recorder, given, entered = _recorder(tmp_path / "r", steps=(0,)), threading.Event(), threading.Event()

    def b():
        context = recorder.step(0)
        given.set()
        entered.wait(WAIT_S)
        with context:
            _train(recorder, 0)
    b_thread = threading.Thread(target=b, name="B")
    b_thread.start()
    assert given.wait(WAIT_S)
    with recorder.step(0):
        _train(recorder, 0)
    entered.set()
    b_thread.join(WAIT_S)
    recorder.close()
    rows = (tmp_path / "r" / "recorded_steps.jsonl").read_text().splitlines()
    assert [r.step for r in recorder.records] == [0] and len(rows) == 1 and said.by_thread == {}


def test_finish_called_by_a_handler_inside_the_step_s_start_ends_nothing(tmp_path, monkeypatch):
    """A signal's handler calling ``finish()`` while the step's meter was starting ended the step half begun:
    lost, with an internal error as its warning. The start now goes on and the step is recorded."""
    said = _Said(monkeypatch)
    recorder, returned = _recorder(tmp_path / "r"), []
    previous = signal.signal(signal.SIGUSR1, lambda *_: returned.append(recorder.finish()))
    real_enter, armed = MemoryMeter.__enter__, [True]

    def enter(self):
        if armed:
            armed.clear()
            signal.raise_signal(signal.SIGUSR1)
        return real_enter(self)

    monkeypatch.setattr(MemoryMeter, "__enter__", enter)
    try:
        with recorder.step(0):
            _train(recorder, 0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    recorder.close()
    assert returned == [None] and said.by_thread == {}
    assert [r.step for r in recorder.records] == [0] and _recording_is_off() and _free(tmp_path / "r")


def _child_step_while_a_parent_thread_holds_the_lock(recorder) -> tuple[bool, bool]:
    """Fork while another thread holds ``recorder``'s lock; in the child ask for step 0. Returns whether the child's
    ``step()`` came back (within 10 s) and whether it came back as :data:`NOOP` with the parent's-recorder warning."""
    import os

    holding, done = threading.Event(), threading.Event()

    def hold():
        with recorder._serial:
            holding.set()
            done.wait(WAIT_S)
    holder_thread = threading.Thread(target=hold)
    holder_thread.start()
    assert holding.wait(WAIT_S)
    pid = os.fork()
    if pid == 0:  # the child: a step asked for must come back, unrecorded
        code = 1
        try:
            signal.alarm(10)  # a child that waits for ever is ended (and the caller sees it in its status)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                context = recorder.step(0)
            code = 0 if context is recorder_module.NOOP and any("its parent's" in str(w.message) for w in caught) \
                else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    done.set()
    holder_thread.join(WAIT_S)
    came_back = os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 3)
    return came_back, came_back and os.WEXITSTATUS(status) == 0


def test_a_child_forked_while_another_thread_changes_a_step_can_ask_for_steps(tmp_path):
    """A fork while another thread of the parent held the recorder's lock (starting or ending a step) gave the
    child a lock held for ever by a thread it does not have: the child's next ``step()`` would wait for good.
    The child's copy gets a lock of its own, and its step is refused as the parent's recorder's, in one warning."""
    recorder = _recorder(tmp_path / "r")
    came_back, said = _child_step_while_a_parent_thread_holds_the_lock(recorder)
    recorder.close()
    assert came_back and said


class _Interrupted(Exception):
    """A program's signal handler that raises."""


def test_signals_raising_in_close_never_leave_the_recorder_s_lock_held(tmp_path):
    """A signal whose handler raises (Ctrl-C) landing as ``close()`` took the recorder's lock left it held for
    good, another thread stepping meanwhile: every later step of every other thread waited for ever (in an audit,
    1778 of 2032 such interrupts). Two seconds of such signals now leave it free every time."""
    import os

    recorder = _recorder(tmp_path / "r", steps=(0,))
    recorder.close()
    stop, armed = threading.Event(), [False]

    def handler(signum, frame):
        if armed[0]:
            raise _Interrupted()

    def stepper():
        while not stop.is_set():
            recorder.step()

    def sender():
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.0003)
    previous = signal.signal(signal.SIGUSR1, handler)
    threads = [threading.Thread(target=stepper, daemon=True), threading.Thread(target=sender, daemon=True)]
    for thread in threads:
        thread.start()
    interrupts = leaks = 0
    try:
        ends = time.monotonic() + 2.0
        while time.monotonic() < ends:
            try:
                armed[0] = True
                recorder.close()
            except _Interrupted:
                interrupts += 1
            finally:
                armed[0] = False
            while recorder._serial._is_owned():  # held by this thread after close() came back: leaked
                leaks += 1
                recorder._serial.release()
    finally:
        stop.set()
        for thread in threads:
            thread.join(WAIT_S)
        signal.signal(signal.SIGUSR1, previous)
    assert interrupts > 20 and leaks == 0, (interrupts, leaks)


@pytest.mark.parametrize("change", ["close", "abort"])
def test_a_signal_landing_at_any_call_of_close_or_abort_leaves_the_lock_free(tmp_path, change):
    """Where a raising handler can run: at each call's start and at each return from a C function (where the
    interpreter checks for signals). Landing just after ``close()`` had taken the lock (a generator's
    ``__enter__`` returning it), or as it began to give it back (a call in its ``finally``), left it held
    while the exception lived, or for good. Each point of one ``close()`` (``abort()``) is tried in turn."""
    recorder = _recorder(tmp_path / "r", steps=(0,))
    recorder.close()
    run, kept, points = getattr(recorder, change), [], []

    def handler(signum, frame):
        raise _Interrupted()
    previous = signal.signal(signal.SIGUSR1, handler)  # first: holding signals back visits each handler
    try:
        sys.setprofile(lambda frame, event, arg: points.append(event) if event in ("call", "c_call") else None)
        run()
        sys.setprofile(None)
        for k in range(len(points)):
            seen = [0]

            def land(frame, event, arg, k=k):
                if event in ("call", "c_return"):
                    seen[0] += 1
                    if seen[0] > k:
                        sys.setprofile(None)
                        signal.raise_signal(signal.SIGUSR1)
            try:
                sys.setprofile(land)
                run()
            except _Interrupted:
                if recorder._serial._is_owned():
                    kept.append((k, "while the exception lives"))
            finally:
                sys.setprofile(None)
            if recorder._serial._is_owned() or getattr(recorder._without, "on", False):
                kept.append((k, "for good"))
                while recorder._serial._is_owned():
                    recorder._serial.release()
                recorder._without.on = False
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(points) > 20 and not kept, kept


def test_a_child_forked_while_another_thread_asks_a_closed_recorder_for_a_step_can_ask_too(tmp_path):
    """Only open recorders got a lock of their own in a forked child: a closed (or not recording) one's lock,
    held by a parent thread in its ``step()`` as the fork came, made the child's ``step()`` wait for ever."""
    recorder = _recorder(tmp_path / "r")
    recorder.close()
    came_back, _ = _child_step_while_a_parent_thread_holds_the_lock(recorder)
    assert came_back


def test_finish_of_a_step_whose_thread_ended_ends_it_unrecorded(tmp_path, monkeypatch):
    """``finish()`` refused a step begun by a thread that had since ended (not its thread's), so the step stayed
    open for good: the profiler on, and every later step of every recorder refused until ``close()``."""
    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r")
    began = threading.Thread(target=lambda: recorder.start(0), name="B")
    began.start()
    began.join(WAIT_S)
    assert recorder.finish() is None and not recorder.recording and _recording_is_off()
    with recorder.step(1):
        _train(recorder, 1)
    recorder.close()
    assert said.by_thread["MainThread"] == ["fusedce-profile: step 0 is not recorded: the thread that began it "
                                            "ended without finishing it"]
    assert [r.step for r in recorder.records] == [1] and _free(tmp_path / "r")


def test_a_handler_s_step_inside_this_recorder_s_write_is_said_not_recorded(tmp_path, monkeypatch):
    """A signal's handler asking this recorder for a step while its previous step was being written (the report
    rendered) began that step, whose end the write then ignored: left open, the profiler on, ended later as cut."""
    said = _Said(monkeypatch)
    recorder, asked = _recorder(tmp_path / "r"), []

    def write(folder):
        if not asked:
            asked.append(True)
            signal.raise_signal(signal.SIGUSR1)
    recorder.after_record = write

    def handler(signum, frame):
        with recorder.step(1):
            _train(recorder, 1)
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with recorder.step(0):
            _train(recorder, 0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    open_after = recorder.recording or not _recording_is_off()
    recorder.close()
    assert not open_after and [r.step for r in recorder.records] == [0]
    assert said.by_thread["MainThread"] == ["fusedce-profile: step 1 is not recorded: this StepRecorder was "
                                            "recording another step (one step at a time)"]


def test_a_stale_step_found_by_several_threads_at_once_is_ended_and_said_once(tmp_path, monkeypatch):
    """Data-parallel replicas' hooks found one stale step at the same moment: each read the step and ended it
    outside the lock, so it was said not recorded twice (and a reader finding it already gone would raise in the
    user's forward). Thread A's ending is slowed so that B arrives while A is inside it."""
    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r", steps=(0,))
    alive = [True]
    recorder.loop_alive = lambda: alive[0]
    recorder.start(0)
    alive[0] = False  # the loop that began the step has ended (an exception left it)
    real_abort, inside, errors = type(recorder)._abort, threading.Event(), []

    def slow_abort(self):
        inside.set()
        time.sleep(0.2)
        return real_abort(self)
    monkeypatch.setattr(type(recorder), "_abort", slow_abort)

    def find_it_stale():
        try:
            if threading.current_thread().name == "B":
                inside.wait(WAIT_S)
            recorder.end_stale()
        except Exception as error:  # noqa: BLE001 - what the user's forward would have raised
            errors.append(repr(error))
    threads = [threading.Thread(target=find_it_stale, name=name) for name in "AB"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not errors and not recorder.recording and _recording_is_off()
    assert sum(said.by_thread.values(), []) == ["fusedce-profile: step 0 is not recorded: the training loop that "
                                               f"began it ended (an exception left it); {tmp_path / 'r'} is released"]


def test_a_stale_step_found_again_while_it_is_being_written_is_not_said_lost(tmp_path, monkeypatch):
    """A stale step closed by its loop's owner: while ``close()`` wrote it, a signal's handler ran a forward, whose
    hook found the step stale and ended it — a no-op inside that end, which went on to write it — yet said "step 0 is
    not recorded". The handler is played by a call inside the step's writing."""
    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r", steps=(0,))
    alive = [True]
    recorder.loop_alive = lambda: alive[0]
    recorder.start(0)
    _train(recorder, 0)
    alive[0] = False
    real_ended = type(recorder)._ended

    def ended_with_a_handler_inside(self, rec, ok):
        self.end_stale()  # the handler's forward, in this thread, as the step is being ended
        return real_ended(self, rec, ok)
    monkeypatch.setattr(type(recorder), "_ended", ended_with_a_handler_inside)
    recorder.close()
    assert [r.step for r in recorder.records] == [0] and not recorder.recording and _recording_is_off()
    assert said.by_thread == {}


def test_a_child_forked_inside_a_recorded_step_does_not_write_it(tmp_path):
    """A process forked between ``start()`` and ``finish()`` whose child went on with the loop: the child's
    ``finish()`` wrote the parent's step into the parent's folder, and the parent wrote it again (rows [0, 0])."""
    import os

    recorder = _recorder(tmp_path / "r")
    recorder.start(0)
    _train(recorder, 0)
    pid = os.fork()
    if pid == 0:  # the child: the step is its parent's, ended here unrecorded with one warning
        code = 1
        try:
            signal.alarm(10)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                record = recorder.finish()
            said = [str(w.message) for w in caught if "fusedce" in str(w.message)]
            code = 0 if record is None and not recorder.recording and said == [
                "fusedce-profile: step 0 is not recorded: this process was forked from the one that began it"] else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    record = recorder.finish()
    recorder.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert record is not None and _recorded(tmp_path / "r") == [0]


def test_a_recorder_subclass_that_defines_equality_can_be_made(tmp_path):
    """Every recorder is remembered for a forked child's sake; remembered in a set, one whose class defines
    ``__eq__`` (so has no hash: a ``@dataclass``, a user's subclass) could not be made at all."""

    class Compared(StepRecorder):
        def __eq__(self, other):
            return self is other

    recorder = Compared(WrappedHeadLM(), tmp_path / "r", steps=(0,), trace=False, snapshot=False, report=False)
    with recorder.step(0):
        _train(recorder, 0)
    recorder.close()
    assert [r.step for r in recorder.records] == [0]


def _begun_by_a_native_thread_that_ended(recorder):
    """Step 0 of ``recorder`` started by a ``_thread`` thread (one ``threading`` did not start), which then ended;
    returns the step."""
    import _thread

    began = threading.Event()

    def begin():
        try:
            recorder.start(0)
        finally:
            began.set()
    _thread.start_new_thread(begin, ())
    assert began.wait(WAIT_S)
    step, deadline = recorder._active, time.monotonic() + WAIT_S
    while step.owner_alive() and time.monotonic() < deadline:  # its last instructions
        time.sleep(0.01)
    return step


def test_finish_of_a_step_begun_by_a_thread_threading_did_not_start_ends_it_once_that_thread_is_gone(tmp_path,
                                                                                                      monkeypatch):
    """A thread started outside ``threading`` (``_thread.start_new_thread``, a native one) is a stand-in that
    says it is alive for ever: a step it began and left was refused to every other thread's ``finish()``,
    open for good."""
    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r")
    _begun_by_a_native_thread_that_ended(recorder)
    assert recorder.finish() is None and not recorder.recording and _recording_is_off()
    recorder.close()
    assert said.by_thread["MainThread"] == ["fusedce-profile: step 0 is not recorded: the thread that began it "
                                            "ended without finishing it"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the operating system's thread list: Linux")
def test_a_live_thread_threading_did_not_start_is_alive_between_its_calls_into_python(monkeypatch):
    """A native thread calling in through callbacks (ctypes, a C++ extension) has no Python frame between two
    calls: told alive by its frames, its step was ended from another thread's ``finish()`` and lost. Here a
    ``_thread`` thread stands in, blocked, with the interpreter's frame list emptied to show no frame."""
    import _thread

    from fusedce_profiler.instrument.recording.phases import StepRecording, _task_start

    made, go, gone = [], threading.Event(), threading.Event()

    def native():
        made.append((threading.current_thread(), threading.get_native_id(), _task_start(threading.get_native_id())))
        go.wait(WAIT_S)
        gone.set()
    _thread.start_new_thread(native, ())
    deadline = time.monotonic() + WAIT_S
    while not made and time.monotonic() < deadline:
        time.sleep(0.01)
    step = StepRecording.__new__(StepRecording)
    step.owner, step.native_id, step.native_start = made[0]
    with monkeypatch.context() as patched:
        patched.setattr(sys, "_current_frames", lambda: {})
        alive_between_calls = step.owner_alive()
    go.set()
    assert gone.wait(WAIT_S)
    while step.owner_alive() and time.monotonic() < deadline:  # its thread's last instructions
        time.sleep(0.01)
    assert alive_between_calls and not step.owner_alive()


def test_finish_from_a_later_thread_given_a_finished_native_thread_s_ident_ends_it_unrecorded(tmp_path, monkeypatch):
    """The stand-in of a thread ``threading`` did not start is handed to a later such thread given the same
    ident: that thread's ``finish()`` passed as the owner's and read the step's profiler from the wrong thread
    (the step lost, an internal error as its warning). It is told apart by its operating system id."""
    import _thread

    said = _Said(monkeypatch)
    recorder = _recorder(tmp_path / "r")
    first = _begun_by_a_native_thread_that_ended(recorder)
    finished, done = [], threading.Event()

    def later():  # a later native thread; given the same ident, it gets the same stand-in
        try:
            finished.append((threading.current_thread() is first.owner, recorder.finish()))
        finally:
            done.set()
    _thread.start_new_thread(later, ())
    assert done.wait(WAIT_S)
    recorder.close()
    assert finished[0][1] is None and not recorder.records and _recording_is_off()
    ours = sum(said.by_thread.values(), [])
    assert ours == ["fusedce-profile: step 0 is not recorded: the thread that began it ended without finishing "
                    "it"], ours


def test_a_stale_step_is_ended_without_the_lock_when_another_thread_holds_it_past_close_s_wait(tmp_path, monkeypatch):
    """Ending a stale step (a new recorder, the next ``train()``, any module call) waited on the recorder's lock
    without limit: a thread stuck inside a step's start or end hung it until that thread let go (for ever, if
    it never does), where ``close()`` gives up after its wait."""
    from fusedce_profiler.instrument.recording import admission

    said = _Said(monkeypatch)
    monkeypatch.setattr(admission, "CLOSE_WAIT_S", 0.3)
    recorder, alive = _recorder(tmp_path / "r", steps=(0,)), [True]
    recorder.loop_alive = lambda: alive[0]
    recorder.start(0)
    alive[0] = False
    holding, release = threading.Event(), threading.Event()

    def stuck():  # a thread stuck inside a change of this recorder (its meter's end not returning)
        with recorder._serial:
            holding.set()
            release.wait(WAIT_S)
    holder_thread = threading.Thread(target=stuck, name="stuck")
    holder_thread.start()
    assert holding.wait(WAIT_S)
    threading.Timer(5.0, release.set).start()  # lets a waiting end_stale() go on, after 5 s
    started = time.monotonic()
    recorder.end_stale()
    waited = time.monotonic() - started
    release.set()
    holder_thread.join(WAIT_S)
    assert waited < 3.0 and not recorder.recording and _recording_is_off(), waited
    assert said.by_thread["MainThread"][-1].startswith("fusedce-profile: step 0 is not recorded: the training loop")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the operating system's thread list: Linux")
def test_a_later_native_thread_given_both_ids_of_an_ended_one_is_not_the_one_that_began_its_step():
    """A native thread given both the ident (its stack reused) and the id of an ended one that began a step passed
    for it: its ``finish()`` ended the step as its own, reading a profiler another thread had started. Here the
    stand-in of a live native thread with a start time before it began, asked from that thread."""
    import _thread

    from fusedce_profiler.instrument.recording.phases import StepRecording, _task_start

    told, done = [], threading.Event()

    def native():
        try:
            step = StepRecording.__new__(StepRecording)
            step.owner, step.native_id = threading.current_thread(), threading.get_native_id()
            step.native_start = str(int(_task_start(step.native_id)) - 1)  # an ended thread's, begun earlier
            told.append(step.of_this_thread())
            step.native_start = _task_start(step.native_id)
            told.append(step.of_this_thread())
        finally:
            done.set()
    _thread.start_new_thread(native, ())
    assert done.wait(WAIT_S) and told == [False, True]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the operating system's thread list: Linux")
def test_a_later_thread_given_a_native_thread_s_id_does_not_keep_its_step_alive():
    """Thread ids come round again (32,768 on many machines): a thread of the process given an ended native
    thread's id kept that thread's step alive, every later step refused until ``close()``. The thread's start
    time tells them apart: here a stand-in with the id of a live thread and another start time."""
    import _thread

    from fusedce_profiler.instrument.recording.phases import StepRecording, _task_start

    made, go = [], threading.Event()

    def native():
        made.append(threading.current_thread())
        go.wait(WAIT_S)
    _thread.start_new_thread(native, ())
    deadline = time.monotonic() + WAIT_S
    while not made and time.monotonic() < deadline:
        time.sleep(0.01)
    step = StepRecording.__new__(StepRecording)
    step.owner, step.native_id = made[0], threading.get_native_id()  # this live thread's id ...
    step.native_start = str(int(_task_start(step.native_id)) - 1)  # ... with a start time before it began
    try:
        assert not step.owner_alive()
        step.native_start = _task_start(step.native_id)
        assert step.owner_alive()
    finally:
        go.set()
