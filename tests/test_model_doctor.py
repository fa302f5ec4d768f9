"""doctor: a correct wrapper passes every item; each planted mistake fails its own item."""
import pytest
import torch.nn.functional as F

from profiler.configs import get_preset
from profiler.training.doctor import load_wrapper, run_doctor


def _ce(model, hidden, labels, *, weight=None, bias="model", shift=True, ignore_index=-100, reduction="mean"):
    weight = model.lm_head.weight if weight is None else weight
    bias = model.lm_head.bias if bias == "model" else bias
    logits = F.linear(hidden, weight, bias)
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=ignore_index, reduction=reduction)


def correct(model, input_ids, labels):
    return _ce(model, model(input_ids), labels)


def other_modules_weight(model, input_ids, labels):
    return _ce(model, model(input_ids), labels, weight=model.embed.weight)


_stale = {}


def stale_copy(model, input_ids, labels):
    weight = _stale.setdefault(id(model), model.lm_head.weight.detach().clone())
    return _ce(model, model(input_ids), labels, weight=weight)


def not_shifted(model, input_ids, labels):
    return _ce(model, model(input_ids), labels, shift=False)


def padding_trained(model, input_ids, labels):
    return _ce(model, model(input_ids), labels.clamp(min=0))


def wrong_ignore_index(model, input_ids, labels):
    return _ce(model, model(input_ids), labels, ignore_index=0)


def summed(model, input_ids, labels):
    return _ce(model, model(input_ids), labels, reduction="sum")


def bias_dropped(model, input_ids, labels):
    return _ce(model, model(input_ids), labels, bias=None)


def norm_skipped(model, input_ids, labels):
    return _ce(model, model.trunk(input_ids), labels)


def _verdicts(fn):
    return {check.item: check.verdict for check in run_doctor(fn)}


@pytest.fixture(autouse=True)
def _fresh_stale_cache():
    _stale.clear()


def test_correct_wrapper_passes_every_item():
    verdicts = _verdicts(correct)
    assert set(verdicts.values()) == {"pass"}, verdicts
    assert len(verdicts) >= 9


@pytest.mark.parametrize("wrapper, item", [
    (other_modules_weight, "uses lm_head.weight itself"),
    (other_modules_weight, "gradient reaches lm_head.weight"),
    (stale_copy, "uses lm_head.weight itself"),
    (stale_copy, "gradient reaches lm_head.weight"),
    (stale_copy, "tied embedding gets both gradients"),
    (not_shifted, "targets shifted (position t predicts labels[t+1])"),
    (padding_trained, "ignore_index (-100) honoured"),
    (wrong_ignore_index, "ignore_index (-100) honoured"),
    (summed, "reduction is mean over valid tokens"),
    (bias_dropped, "lm_head.bias used"),
    (norm_skipped, "final norm applied"),
])
def test_planted_mistake_fails_its_item(wrapper, item):
    verdicts = _verdicts(wrapper)
    assert verdicts.get(item) == "fail", verdicts


def test_planted_mistake_leaves_unrelated_items_passing():
    verdicts = _verdicts(bias_dropped)
    assert verdicts["targets shifted (position t predicts labels[t+1])"] == "pass"
    assert verdicts["ignore_index (-100) honoured"] == "pass"
    assert verdicts["uses lm_head.weight itself"] == "pass"


def test_soft_cap_check_appears_and_catches_a_missing_cap():
    config = get_preset("tiny").replace(final_logit_softcapping=5.0)

    def capped(model, input_ids, labels):
        logits = model.logits(model(input_ids))[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1))

    ok = {c.item: c.verdict for c in run_doctor(capped, config)}
    bad = {c.item: c.verdict for c in run_doctor(correct, config)}
    assert ok["logit soft-cap applied"] == "pass"
    assert bad["logit soft-cap applied"] == "fail"


def test_load_wrapper_names_the_bad_part():
    with pytest.raises(ValueError, match="module:callable"):
        load_wrapper("no_colon")
    with pytest.raises(ValueError, match="cannot import"):
        load_wrapper("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="no attribute"):
        load_wrapper(f"{__name__}:missing")
    assert load_wrapper(f"{__name__}:correct") is correct
