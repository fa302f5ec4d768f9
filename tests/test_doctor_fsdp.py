"""``doctor`` on an FSDP2-wrapped model (``fully_shard``) on two gloo ranks on the CPU, from Python and
under ``torchrun``: the checks run on each rank (its shard of every gradient), a correct wiring
passes on both, and a sharded head weight passed as a DTensor beside plain tensors fails "the
weight at the call" on both."""
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


def test_the_command_under_torchrun_checks_each_rank_in_its_own_folder(tmp_path):
    import json
    import subprocess
    import sys

    from tests.distributed import free_port
    from tests.processes import cli_env

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), "-m", "fusedce_cli", "doctor", "--model", "tests.doctor_models:fsdp_untied",
               "--loss", "tests.doctor_wrappers:fsdp_correct", "--device", "cpu", "--compile-backend", "none",
               "--out", "d"]
    result = subprocess.run(command, cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads((tmp_path / name / "doctor.json").read_text()) for name in ("d", "d-rank1")]
    assert [(r["rank"], r["world_size"]) for r in records] == [(0, 2), (1, 2)]
    assert all(r["checks"] and not any(c["verdict"] == "fail" for c in r["checks"]) for r in records)
