"""The README's promises that code can check: exit codes, install notes, the doctor's model."""
from __future__ import annotations

import re

import torch

from fusedce_profile import exit_codes
from fusedce_profile.defaults import CELL_TIMEOUT_S
from processes import REPO
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.judgements.doctor.doctor import CPU_MAX_PARAMETERS, make_batch

README = " ".join((REPO / "README.md").read_text().split())


def test_every_exit_code_is_in_the_readme_with_its_meaning():
    codes = {exit_codes.OK: "ok", exit_codes.CHECK_FAILED: "a check failed", exit_codes.BAD_INPUT: "bad usage", exit_codes.RUN_FAILED: "the run could not go on",
             exit_codes.INTERRUPTED: "interrupted by Ctrl-C", exit_codes.TERMINATED: "by SIGTERM"}
    line = README.split("Exit codes:")[1].split("Progress bars")[0]
    for code, meaning in codes.items():
        assert re.search(rf"\b{code} {re.escape(meaning)}", line), (code, meaning)


def test_the_readme_says_how_to_install_on_a_machine_without_a_gpu():
    assert "install the CPU build of torch first" in README
    assert '`pip install ".[triton]"` adds it' in README and "Triton is not a dependency" in README


def test_the_readme_states_the_default_cell_timeouts():
    cuda, cpu = (f"{CELL_TIMEOUT_S[kind]:g}" for kind in ("cuda", "cpu"))
    assert f"`--cell-timeout SECONDS`, by default {cuda} on CUDA and {cpu} on the CPU; 0 for none" in README


def test_the_batch_and_size_guard_the_readme_gives_for_doctor_are_the_ones_it_uses():
    batch = make_batch(512)
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
    assert (batch["labels"] == -100).any() and "-100 at padding" in README
    assert f"models above {CPU_MAX_PARAMETERS / 1e6:.0f} M parameters are refused in one line" in README
