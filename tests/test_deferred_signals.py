"""Signals held back while a run's state changes (profiler/instrument/deferred_signals.py): each one comes
once, right after the block, to the handler it was sent for; an exception it raises takes back a change
that had just been made."""
from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

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
