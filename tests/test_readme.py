"""The README's promises that code can check: exit codes, install notes, the doctor's model."""
from __future__ import annotations

import re

import torch

from cli import exit_codes
from cli.options import CELL_TIMEOUT_S
from processes import REPO
from profiler.configs import get_preset
from profiler.training.doctor import _doctor_model, make_batch

README = " ".join((REPO / "README.md").read_text().split())


def test_every_exit_code_is_in_the_readme_with_its_meaning():
    codes = {exit_codes.OK: "ok", exit_codes.CHECK_FAILED: "a check failed", exit_codes.BAD_INPUT: "bad usage",
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


def test_the_model_the_readme_says_doctor_passes_is_the_one_it_passes():
    tiny = get_preset("tiny")
    assert (f"default `tiny`: H = {tiny.hidden_size}, V = {tiny.vocab_size}, {tiny.num_hidden_layers} layers"
            in README)
    model = _doctor_model(tiny, tied=True, seed=0)
    assert f"`{type(model).__module__}.{type(model).__qualname__}`" in README
    assert model.lm_head.bias is not None and model.lm_head.weight is model.embed.weight
    input_ids, labels, _ = make_batch(tiny)
    assert input_ids.dtype == labels.dtype == torch.int64
    assert f"are ({input_ids.shape[0]}, {input_ids.shape[1]}) int64" in README
    assert int((labels == -100).any(dim=1).sum()) == 2 and "`-100` on two padded rows" in README
    hidden = model(input_ids)
    assert hidden.shape == (*input_ids.shape, tiny.hidden_size)
    assert torch.equal(hidden, model.final_norm(model.trunk(input_ids)))
    assert model.logits(hidden).shape == (*input_ids.shape, tiny.vocab_size)
