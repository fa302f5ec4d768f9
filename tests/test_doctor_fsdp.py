"""``doctor`` on an FSDP2-wrapped model (``fully_shard``) on two gloo ranks on the CPU: the checks
run on each rank (its shard of every gradient), a correct wiring passes on both, and a sharded
head weight passed as a DTensor beside plain tensors fails "the weight at the call" on both."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.distributed import run_world

pytest.importorskip("torch.distributed.fsdp")


def _doctor_on_each_rank(rank: int, world_size: int, wrapper: str, expect_failed: list[str]) -> None:
    import tests.doctor_wrappers as wrappers
    from fusedce_profiler.instrument.models.source import UserSource
    from fusedce_profiler.judgements.doctor.doctor import run_doctor

    source = UserSource("tests.doctor_models:fsdp_untied")
    run = run_doctor(getattr(wrappers, wrapper), source.build("cpu"), source=source, mode="fp32")
    verdicts = {c.key: c.verdict for c in run.checks}
    failed = sorted(k for k, v in verdicts.items() if v == "fail")
    assert (run.rank, run.world_size) == (rank, world_size)
    assert set(expect_failed) <= set(failed), {c.key: (c.verdict, c.evidence[:300]) for c in run.checks}
    if not expect_failed:
        assert failed == [], {c.key: (c.verdict, c.evidence) for c in run.checks if c.verdict == "fail"}
    dist.barrier()


def test_a_correct_wiring_passes_on_every_rank_of_an_fsdp2_model():
    run_world(_doctor_on_each_rank, 2, "fsdp_correct", [], timeout_s=240)


def test_a_dtensor_weight_beside_plain_tensors_fails_the_call_check_on_every_rank():
    run_world(_doctor_on_each_rank, 2, "fsdp_dtensor_weight", ["call"], timeout_s=240)
