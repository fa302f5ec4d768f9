"""doctor on the user's own model: every correct wiring passes, every planted mistake fails its
own check, and the checks that depend on a failed one say "not checked" instead of failing too.

The model is the original report's shape (tests/doctor_models.py): an LM head wrapped in a
module, tied and untied, with and without a bias; the wrappers call fusedce's fused loss the
way a user's wrapper around a library's loss does.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusedce import linear_cross_entropy
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.instrument.models.source import BuiltinSource, UserSource
from fusedce_profiler.judgements.doctor.precision import SAFETY
from fusedce_profiler.judgements.doctor.doctor import CHECKS, DoctorRun, cpu_size_guard, load_wrapper, run_doctor

MODELS = ("untied", "tied", "untied_bias", "tied_bias")


def _fused(model, hidden, labels, *, weight=None, bias="head", shift=True, ignore_index=-100, **kw):
    inner = model.head.inner
    weight = inner.weight if weight is None else weight
    bias = inner.bias if bias == "head" else bias
    if shift:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    h = hidden.reshape(-1, hidden.shape[-1])
    return linear_cross_entropy(h, weight, labels.reshape(-1), bias, ignore_index=ignore_index, **kw)


def correct(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"])


def correct_three_arguments(model, input_ids, labels):
    return _fused(model, model.body(input_ids), labels)


def detached_hidden(model, batch):
    return _fused(model, model.body(batch["input_ids"]).detach(), batch["labels"])


def no_grad_hidden(model, batch):
    with torch.no_grad():
        hidden = model.body(batch["input_ids"])
    return _fused(model, hidden, batch["labels"])


def detached_weight(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], weight=model.head.inner.weight.detach())


_stale: dict[int, torch.Tensor] = {}


def stale_copy(model, batch):
    weight = _stale.setdefault(id(model), model.head.inner.weight.detach().clone())
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], weight=weight)


def embedding_weight(model, batch):  # untied models only: another module's (V, H) parameter
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], weight=model.embed.weight)


def not_shifted(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], shift=False)


def shifted_twice(model, batch):
    hidden, labels = model.body(batch["input_ids"])[:, :-1], batch["labels"][:, 1:]
    return _fused(model, hidden, labels)


def padding_trained(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"].clamp(min=0))


def wrong_ignore_index(model, batch):  # the library's default is not -100: raises on -100 labels
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], ignore_index=0)


def wrong_ignore_index_nan(model, batch):
    """The same mistake where the loss returns NaN instead of raising (fusedce on CUDA marks
    out-of-range targets with NaN rather than synchronising to check them)."""
    labels = batch["labels"]
    loss = _fused(model, model.body(batch["input_ids"]), labels.clamp(min=0), ignore_index=0)
    return loss + torch.where((labels == -100).any(), float("nan"), 0.0)


def summed(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], reduction="sum")


def accumulation_scaled(model, batch):  # divides by 4 accumulation steps; the trainer does that already
    return correct(model, batch) / 4


def norm_skipped(model, batch):
    return _fused(model, model.trunk(batch["input_ids"]), batch["labels"])


def bias_dropped(model, batch):
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], bias=None)


def label_smoothed(model, batch):  # a real difference the other checks do not explain
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], label_smoothing=0.2)


def gradient_doubled(model, batch):  # the value is right, the gradient twice too large
    loss = correct(model, batch)
    return loss + (loss - loss.detach())


def wrapper_weight(model, batch):  # the report's wrapper: the tie assigned on the wrapper
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], weight=model.head.weight, bias=None)


def spare_bias_passed(model, batch):  # a (V,) parameter the head's forward never adds
    return _fused(model, model.body(batch["input_ids"]), batch["labels"], bias=model.head.bias)


def _run(fn, model: str = "untied", **kwargs) -> DoctorRun:
    _stale.clear()
    source = UserSource(f"tests.doctor_models:{model}")
    return run_doctor(fn, source.build("cpu"), source=source, **kwargs)


def _verdicts(run: DoctorRun) -> dict[str, str]:
    return {c.key: c.verdict for c in run.checks}


@pytest.mark.parametrize("model", MODELS)
def test_correct_wiring_passes_every_check(model):
    run = _run(correct, model)
    verdicts = _verdicts(run)
    assert run.passed and set(verdicts) == {key for key, _, _ in CHECKS}
    assert set(verdicts.values()) <= {"pass", "n/a"}, verdicts


def test_three_argument_wrapper_is_accepted():
    assert _run(correct_three_arguments).passed


BUGS = [  # (wrapper, the check it must fail, models it applies to)
    (detached_hidden, "body", MODELS),
    (no_grad_hidden, "body", MODELS),
    (detached_weight, "weight", MODELS),
    (stale_copy, "fresh", MODELS),
    (embedding_weight, "weight", ("untied", "untied_bias")),
    (not_shifted, "shift", MODELS),
    (shifted_twice, "shift", MODELS),
    (padding_trained, "ignore", MODELS),
    (wrong_ignore_index, "ignore", MODELS),
    (wrong_ignore_index_nan, "ignore", MODELS),
    (summed, "reduction", MODELS),
    (accumulation_scaled, "reduction", MODELS),
    (norm_skipped, "norm", MODELS),
    (bias_dropped, "bias", ("untied_bias", "tied_bias")),
    (gradient_doubled, "gradient", MODELS),
]
CASES = [pytest.param(fn, key, model, id=f"{fn.__name__}-{model}") for fn, key, models in BUGS for model in models]
#: Two checks that see one mistake from two sides: a loss multiplying by a copy of the head's
#: weight gives the weight no gradient ("weight") and does not follow its in-place step ("fresh").
SAME_MISTAKE = {"stale_copy": {"weight"}}


@pytest.mark.parametrize("fn, key, model", CASES)
def test_planted_mistake_fails_its_check_and_nothing_else_fails(fn, key, model):
    run = _run(fn, model)
    verdicts = _verdicts(run)
    assert verdicts[key] == "fail", verdicts
    failed = {k for k, v in verdicts.items() if v == "fail"} - SAME_MISTAKE.get(fn.__name__, set())
    assert failed == {key}, f"knock-on failures: {verdicts}"
    evidence = next(c.evidence for c in run.checks if c.key == key)
    assert any(ch.isdigit() for ch in evidence), evidence  # the numbers it judged by
    assert "unclear" not in verdicts.values(), verdicts
    for check in run.checks:  # every check after a failed premise says which one
        if any(verdicts[d] in ("fail", "not checked") for d in check.depends_on):
            assert check.verdict == "not checked" and "depends on" in check.evidence


def test_unexplained_difference_fails_the_parity_checks():
    verdicts = _verdicts(_run(label_smoothed))
    assert "fail" in (verdicts["loss"], verdicts["gradient"]), verdicts
    assert all(verdicts[k] in ("pass", "n/a") for k in ("weight", "body", "shift", "ignore", "norm", "bias"))


@pytest.mark.parametrize("mode", ["fp32", "amp-bf16"])
def test_broken_tie_on_the_wrapper_is_caught_with_a_correct_loss(mode):
    run = _run(correct, "broken_tie", mode=mode)
    verdicts = _verdicts(run)
    assert {k for k, v in verdicts.items() if v == "fail"} == {"tie"}, verdicts
    tie = next(c for c in run.checks if c.key == "tie")
    assert "head.weight" in tie.evidence and "head.inner.weight" in tie.evidence


def test_the_reports_wrapper_fails_tie_and_weight_and_judges_nothing_downstream():
    run = _run(wrapper_weight, "broken_tie")
    verdicts = _verdicts(run)
    assert verdicts["tie"] == verdicts["weight"] == "fail"
    weight = next(c for c in run.checks if c.key == "weight")
    assert "embed.weight" in weight.evidence  # where the head's gradient went instead
    assert verdicts["loss"] == verdicts["gradient"] == "not checked"


def test_bias_passed_where_the_head_has_none_is_caught():
    verdicts = _verdicts(_run(spare_bias_passed, "spare_bias"))
    assert {k for k, v in verdicts.items() if v == "fail"} == {"bias"}, verdicts
    assert _run(correct, "spare_bias").passed


def test_detached_copy_is_named_as_such():
    weight = next(c for c in _run(detached_weight, "tied").checks if c.key == "weight")
    assert "detached copy" in weight.evidence


def test_a_head_without_bias_gets_no_bias_and_no_false_alarm():
    run = _run(correct, "untied")
    bias = next(c for c in run.checks if c.key == "bias")
    assert bias.verdict == "pass" and "no bias" in bias.evidence
    assert run.head["bias"] is None


@pytest.mark.parametrize("mode", ["fp32", "amp-bf16"])
def test_builtin_model_with_a_soft_cap_catches_a_missing_cap(mode):
    # The tiny model's raw logits stay below 0.6: a cap of 0.2 changes them (5.0 would not).
    source = BuiltinSource(get_preset("tiny").replace(final_logit_softcapping=0.2, num_hidden_layers=1))

    def uncapped(model, batch):
        logits = F.linear(model.hidden_states(batch["input_ids"]), model.lm_head.weight)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1))

    def capped(model, batch):
        logits = model(batch["input_ids"])[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1))

    assert run_doctor(capped, source.build("cpu"), source=source, mode=mode).passed
    verdicts = _verdicts(run_doctor(uncapped, source.build("cpu"), source=source, mode=mode))
    assert verdicts["transform"] == "fail" and verdicts["loss"] == "not checked", verdicts


def test_stored_run_round_trips_and_old_list_format_reads():
    run = _run(summed)
    again = DoctorRun.from_dict(run.to_dict())
    assert again.checks == run.checks and again.passed is False
    old = DoctorRun.from_dict([{"item": "x", "verdict": "pass", "evidence": "e"}])
    assert old.passed and old.checks[0].key == ""


def test_cpu_size_guard_names_the_numbers():
    assert cpu_size_guard(10_000_000, "tiny") is None
    message = cpu_size_guard(1_200_000_000, "llama-1b")
    assert "1200 M" in message and "50 M" in message and "--device cuda" in message


def test_load_wrapper_names_the_bad_part():
    with pytest.raises(ValueError, match="module:callable"):
        load_wrapper("no_colon")
    with pytest.raises(ValueError, match="no module named .no_such_module_xyz. on Python.s path"):
        load_wrapper("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="no attribute"):
        load_wrapper(f"{__name__}:missing")
    assert load_wrapper(f"{__name__}:correct") is correct


@pytest.mark.parametrize("fn, key", [(correct, None), (detached_hidden, "body"), (no_grad_hidden, "body"),
                                     (not_shifted, "shift"), (shifted_twice, "shift"), (summed, "reduction"),
                                     (accumulation_scaled, "reduction"), (embedding_weight, "weight"),
                                     (detached_weight, "weight"), (stale_copy, "fresh"), (bias_dropped, "bias"),
                                     (padding_trained, "ignore"), (wrong_ignore_index, "ignore"),
                                     (norm_skipped, "norm"), (gradient_doubled, "gradient")])
def test_under_bf16_autocast_the_bf16_tolerance_keeps_every_verdict(fn, key):
    # The GPU's mode (amp-bf16), here under the CPU's autocast: rounding must not raise a false alarm.
    run = _run(fn, "untied_bias", mode="amp-bf16")
    # The tolerance is measured: SAFETY × the spread bf16 autocast puts on the model's own loss.
    assert run.mode == "amp-bf16" and run.spread["samples"] == 2 and run.spread["gradient"] > 1e-3
    assert run.tolerance == pytest.approx(max(2e-3, SAFETY * max(run.spread["loss"], run.spread["gradient"])))
    failed = {c.key for c in run.checks if c.verdict == "fail"} - SAME_MISTAKE.get(fn.__name__, set())
    assert failed == (set() if key is None else {key}), _verdicts(run)


def test_a_nan_loss_is_stored_as_strict_json_and_rendered(tmp_path):
    import json

    from fusedce_profiler.instrument import store
    from fusedce_reports.doctor_report import render_doctor_markdown

    run = _run(wrong_ignore_index_nan)
    run.losses["yours"] = float("nan")
    text = store.dumps(run.to_dict())
    assert "NaN" in text and json.loads(text, parse_constant=lambda name: pytest.fail(name))
    page = render_doctor_markdown(DoctorRun.from_dict(json.loads(text)), None)
    assert "| yours | NaN |" in page
