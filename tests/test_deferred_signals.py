"""Signals held back while a run's state changes (profiler/instrument/deferred_signals.py): each one comes
once, right after the block, to the handler it was sent for; an exception it raises takes back a change
that had just been made."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

from fusedce_profiler.instrument import deferred_signals
from fusedce_profiler.instrument.deferred_signals import deferred

pytestmark = pytest.mark.faults


def _handlers() -> dict[int, object]:
    return {number: signal.getsignal(number) for number in range(1, signal.NSIG)
            if number not in (signal.SIGKILL, signal.SIGSTOP) and _valid(number)}


def _valid(number: int) -> bool:
    try:
        signal.getsignal(number)
        return True
    except ValueError:
        return False


@pytest.fixture
def usr_handlers():
    """SIGUSR1 and SIGUSR2 handlers that note what they got (restored after the test)."""
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, frame: got.append(number))
                for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    yield got
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_signals_sent_inside_come_once_after_in_order_to_their_own_handlers(usr_handlers):
    before = _handlers()
    with deferred():
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert usr_handlers == []
        assert signal.getsignal(signal.SIGUSR1) is not before[signal.SIGUSR1]  # held back
    assert usr_handlers == [signal.SIGUSR2, signal.SIGUSR1]
    assert _handlers() == before


def test_ctrl_c_inside_is_raised_after_and_takes_back_the_change():
    undone = []
    with pytest.raises(KeyboardInterrupt):
        with deferred(undo=lambda: undone.append(True)):
            os.kill(os.getpid(), signal.SIGINT)
            made = True
    assert made and undone == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_block_that_fails_by_itself_is_not_undone_and_its_signals_still_come(usr_handlers):
    undone = []
    with pytest.raises(RuntimeError):
        with deferred(undo=lambda: undone.append(True)):
            os.kill(os.getpid(), signal.SIGUSR1)
            raise RuntimeError("the block's own failure")
    assert undone == [] and usr_handlers == [signal.SIGUSR1]


def test_a_nested_block_delivers_nothing_until_the_outer_one_ends(usr_handlers):
    with deferred():
        with deferred():
            os.kill(os.getpid(), signal.SIGUSR1)
        assert usr_handlers == []
    assert usr_handlers == [signal.SIGUSR1]


def test_another_thread_changes_no_handler(usr_handlers):
    seen = []

    def work():
        with deferred():
            seen.append(signal.getsignal(signal.SIGUSR1))

    before = signal.getsignal(signal.SIGUSR1)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [before]


def test_an_event_loops_signal_handler_runs_once():
    """An asyncio loop's handler is woken through its wake-up descriptor: set aside while signals are held
    back, so that the signal wakes it once, when it is delivered."""
    ran = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: ran.append(True))
        try:
            with deferred():
                os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(20):
                await asyncio.sleep(0.01)
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    asyncio.run(main())
    assert ran == [True]


class _SignalModule:
    """``signal`` as the deferral sees it, with ``signal.signal`` calling ``on_set(number, handler)`` first."""

    def __init__(self, on_set):
        self._on_set = on_set

    def __getattr__(self, name):
        return getattr(signal, name)

    def signal(self, number, handler):
        self._on_set(number, handler)
        return signal.signal(number, handler)


def _noting(handler) -> bool:
    return getattr(handler, "__func__", None) is getattr(deferred_signals._Held, "note", None)


def test_ctrl_c_landing_while_the_handlers_are_put_back_leaves_every_one_back(usr_handlers, monkeypatch):
    """A Ctrl-C as SIGUSR1's handler was put back stopped the loop there: every later handler stayed the
    deferral's own, for good, and the signals it had noted were never delivered."""
    before = _handlers()

    sent = []

    def on_set(number, handler):
        if number == signal.SIGUSR1 and not _noting(handler) and not sent:  # putting SIGUSR1's handler back
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(deferred_signals, "signal", _SignalModule(on_set))
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGUSR2)
    monkeypatch.undo()
    assert _handlers() == before and usr_handlers == [signal.SIGUSR2]


def test_a_handler_raising_while_the_others_are_replaced_loses_no_signal_and_no_change(usr_handlers,
                                                                                       monkeypatch):
    """Signals landing while the handlers were replaced: one noted, then one whose own handler (not yet
    replaced) raised — the noted one was dropped; a handler run meanwhile that installed another handler saw
    its change undone."""
    def replacement(number, frame):
        pass

    def raising(number, frame):
        signal.signal(signal.SIGUSR2, replacement)  # a handler's own change of another handler
        raise TimeoutError("a watchdog")

    previous = signal.signal(signal.SIGALRM, raising)

    sent = []

    def on_set(number, handler):
        if number == signal.SIGUSR2 and _noting(handler) and not sent:  # SIGUSR1 replaced already, SIGALRM not yet
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGALRM)

    monkeypatch.setattr(deferred_signals, "signal", _SignalModule(on_set))
    try:
        with pytest.raises(TimeoutError):
            with deferred():
                pass
        monkeypatch.undo()
        assert usr_handlers == [signal.SIGUSR1] and signal.getsignal(signal.SIGUSR2) is replacement
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_a_signal_that_came_three_times_is_delivered_three_times(usr_handlers):
    with deferred():
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGUSR1)
    assert usr_handlers == [signal.SIGUSR1] * 3


def test_a_child_forked_from_another_thread_meanwhile_has_its_handlers_back(usr_handlers):
    """A fork from a thread while the main thread held signals back: the child kept the deferral's handlers
    for life (Ctrl-C raised nothing in it, its own handlers never ran)."""
    read, write = os.pipe()

    def fork():
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.kill(os.getpid(), signal.SIGUSR1)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                said = "no KeyboardInterrupt"
            except KeyboardInterrupt:
                said = "KeyboardInterrupt"
            os.write(write, f"{said} {usr_handlers}".encode())
            os._exit(0)
        os.waitpid(pid, 0)

    with deferred():
        thread = threading.Thread(target=fork)
        thread.start()
        thread.join()
    os.close(write)
    assert os.read(read, 200).decode() == f"KeyboardInterrupt [{int(signal.SIGUSR1)}]"
    os.close(read)


def _handler_and_flags(number: int) -> tuple[bytes, bytes]:
    """``sa_handler`` and ``sa_flags`` of the signal's ``struct sigaction`` (64-bit Linux's layout: the mask's
    bytes past the kernel's 8 are whatever the C library leaves there)."""
    raw = deferred_signals._disposition(number).raw
    return raw[0:8], raw[136:140]


@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.maxsize < 2 ** 32, reason="64-bit Linux's layout")
def test_what_the_program_set_below_python_is_as_it_was_after_the_block(usr_handlers, tmp_path):
    """Putting a handler back with ``signal.signal`` installed Python's own C handler with fresh flags: a
    ``faulthandler.register(..., chain=True)`` over the program's handler stopped dumping once any recorder was
    made, and ``signal.siginterrupt(sig, False)`` (``SA_RESTART``) was reset. The whole disposition of each
    signal is now written back."""
    import faulthandler

    signal.siginterrupt(signal.SIGUSR2, False)
    before = _handler_and_flags(signal.SIGUSR2)
    with open(tmp_path / "dump", "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, chain=True)
        try:
            with deferred():
                pass
            os.kill(os.getpid(), signal.SIGUSR1)
        finally:
            faulthandler.unregister(signal.SIGUSR1)
    assert "Current thread" in (tmp_path / "dump").read_text() and usr_handlers == [signal.SIGUSR1]
    assert _handler_and_flags(signal.SIGUSR2) == before


def test_a_handler_installed_within_the_block_that_chains_to_the_one_it_found_reaches_the_programs():
    """Code run within the block (a warnings hook, a finaliser) that installs a handler chaining to the one it
    finds found the deferral's own, which only noted what came: after the block every Ctrl-C was swallowed."""
    chained, original = [], signal.getsignal(signal.SIGINT)
    with deferred():
        found = signal.getsignal(signal.SIGINT)

        def chaining(number, frame):
            chained.append(number)
            found(number, frame)

        signal.signal(signal.SIGINT, chaining)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, original)
    assert chained == [signal.SIGINT]


@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.maxsize < 2 ** 32, reason="64-bit Linux's layout")
def test_a_signal_between_putting_a_handler_back_and_its_disposition_still_gets_the_disposition_back(usr_handlers,
                                                                                                    monkeypatch):
    """A signal whose handler raised right after ``signal.signal`` put a handler back cut the loop before the
    signal's saved disposition was written: the loop resumed past it (the handler no longer the deferral's),
    and ``SA_RESTART`` stayed lost."""
    signal.siginterrupt(signal.SIGUSR2, False)
    before = _handler_and_flags(signal.SIGUSR2)
    real, cut = deferred_signals._set_disposition, []

    def interrupted_once(number, saved):
        if number == signal.SIGUSR2 and not cut:
            cut.append(number)
            raise KeyboardInterrupt  # as a handler landing there would
        real(number, saved)

    monkeypatch.setattr(deferred_signals, "_set_disposition", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            pass
    assert cut and _handler_and_flags(signal.SIGUSR2) == before
