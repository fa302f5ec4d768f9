"""The gloo harness itself: a rank's failure fails the test with that rank's message, and a
rank that never finishes is killed at the deadline instead of hanging the suite."""
from __future__ import annotations

import time

import pytest

from distributed import run_world


def _fails_on_rank_one(rank: int, world: int) -> None:
    assert rank != 1, "planted failure on rank 1"


def _rank_zero_sleeps(rank: int, world: int) -> None:
    if rank == 0:
        time.sleep(120)


def test_a_failed_rank_fails_the_world_with_its_message():
    with pytest.raises(AssertionError, match="planted failure on rank 1"):
        run_world(_fails_on_rank_one, 2, timeout_s=60)


def test_a_rank_that_never_finishes_is_killed_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish in 5 s"):
        run_world(_rank_zero_sleeps, 2, timeout_s=5, collective_timeout_s=60)
    assert time.monotonic() - start < 30
