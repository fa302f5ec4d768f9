"""The doctor's checks of the situations training puts a loss in — a stale weight copy, gradient
accumulation, an all-ignored micro-batch, reduction="none", torch.compile, evaluation, the weight
at the call, the config's loss options, grad_W's accumulator: each planted mistake fails its own
check and the correct wiring passes it, in fp32 and under bf16 autocast on the CPU.

The wrappers are in tests/doctor_wrappers.py, the models in tests/doctor_models.py.
"""
from __future__ import annotations

import pytest
import torch

import tests.doctor_wrappers as wrappers
from fusedce_profiler.instrument.models.source import UserSource
from fusedce_profiler.judgements.doctor.doctor import DoctorRun, run_doctor

MODES = ("fp32", "amp-bf16")
HAS_TORCH_LCE = hasattr(torch.nn.functional, "linear_cross_entropy")

CASES = [pytest.param(*case, marks=pytest.mark.skipif(case[1] == "torch_lce_without_options" and not HAS_TORCH_LCE,
                                                    reason="this torch has no linear_cross_entropy"))
         for case in wrappers.TRAINING_CASES]


def _run(name: str, model: str, mode: str, **kwargs) -> DoctorRun:
    wrappers._copies.clear()
    source = UserSource(f"tests.doctor_models:{model}")
    return run_doctor(getattr(wrappers, name), source.build("cpu"), source=source, mode=mode, **kwargs)


def _check(run: DoctorRun, key: str):
    return next(c for c in run.checks if c.key == key)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key, planted, control, model", CASES)
def test_planted_mistake_fails_its_check_and_the_correct_wiring_passes_it(key, planted, control, model, mode):
    bug = _check(_run(planted, model, mode), key)
    assert bug.verdict == "fail", bug.evidence
    assert any(ch.isdigit() for ch in bug.evidence) or key == "call", bug.evidence
    good = _run(control, model, mode)
    assert _check(good, key).verdict == "pass", _check(good, key).evidence
    assert good.passed, {c.key: c.verdict for c in good.checks}


def test_a_copy_made_once_is_named():
    evidence = _check(_run("stale_copy", "tied", "fp32"), "fresh").evidence
    assert "a copy of the head's weight made once" in evidence


def test_evaluation_fallback_reports_the_memory_it_costs():
    evidence = _check(_run("fused_only_in_training", "untied", "fp32"), "eval").evidence
    # The head's (4, 32, 96) fp32 logits: 48 KiB here, 96 × 4 bytes per token.
    assert "48 KiB here" in evidence and "384 B per token" in evidence


def test_accumulation_without_num_items_reports_the_mean_of_means():
    check = _check(_run("correct", "untied", "fp32"), "accumulation")
    assert check.verdict == "n/a" and "num_items_in_batch" in check.evidence


@pytest.mark.parametrize("mode", MODES)
def test_compiled_loss_that_mishandles_ignored_targets_fails_and_the_correct_one_passes(mode):
    bug = _check(_run("compile_mishandles_ignored", "untied", mode, compile_backend="eager"), "compile")
    assert bug.verdict == "fail" and "ignored" in bug.evidence
    assert _check(_run("correct", "untied", mode, compile_backend="eager"), "compile").verdict == "pass"


@pytest.mark.parametrize("mode", MODES)
def test_the_same_run_gives_the_same_record(mode):
    first, second = _run("correct", "tied_bias", mode).to_dict(), _run("correct", "tied_bias", mode).to_dict()
    assert first == second


def test_the_bf16_tolerance_is_measured_and_shown():
    run = _run("correct", "untied", "amp-bf16")
    spread = run.spread
    assert spread["mode"] == "amp-bf16" and set(spread["groups"]) == {"head.inner.weight", "the body"}
    # bf16 autocast moves the model's own gradients by a measurable amount; fp32 by none at all.
    assert spread["gradient"] > 1e-3 and _run("correct", "untied", "fp32").spread["gradient"] == 0.0
    gradient = _check(run, "gradient").evidence
    assert "head.inner.weight" in gradient and "spread amp-bf16 puts" in gradient
