"""explain on readings made by a model it does not build: the stand-in's extra-activation range
and the allocator's measured slack range keep the truth consistent and still rule out the
planted wrong fused-path state (synthetic world and measured H200 steps, CPU)."""
import json
from pathlib import Path

import pytest

from fusedce_profiler.judgements.explain import calibration as ex_cal
from fusedce_profiler.judgements.explain import records as ex
from fusedce_profiler.judgements.explain import verdict as ex_ver
from fusedce_profiler.judgements.explain.allocator import (IMPLEMENTATION_SPREAD, device_terms, logits_bytes,
                                                           slack_ranges)

MIB, GIB = 1 << 20, 1 << 30
VOCAB, LAYERS_HIDDEN, SEQ = 32777, 12 * 768, 1024
FIXTURE = Path(__file__).parent / "fixtures" / "h200_explain_run2"


def _cal(family, backend, per_sample, slack_in_l, batches=(8, 16)):
    """A calibration of known phase lines (bytes per sample) whose reserved bytes sit
    ``slack_in_l`` bf16 logits copies above the peak."""
    cal = ex.Calibration(family, backend, list(batches), ["ok"] * len(batches))
    fixed = {"forward": 1.5 * GIB, "loss": 1.5 * GIB, "backward": 1.7 * GIB, "optimizer": 3.0 * GIB}
    cal.phase_peaks = {name: [int(fixed[name] + per_sample[name] * b) for b in batches] for name in ex.PHASES}
    cal.reserved = [int(max(v[i] for v in cal.phase_peaks.values()) + slack_in_l[i] * logits_bytes(b, SEQ, VOCAB))
                    for i, b in enumerate(batches)]
    cal.context = [500 * MIB] * len(batches)
    cal.static = [int(fixed["forward"])] * len(batches)
    return ex_cal.fit_lines(cal)


LOGITS = SEQ * VOCAB * 2  # one bf16 logits copy per sample


def _world():
    """The stand-in: eager and sdpa at T=1024 × torch (logits, their fp32 copy and gradient in
    the loss phase) and fusedce (none of them)."""
    cals = []
    for attention, act in (("eager", 1250 * MIB), ("sdpa", 330 * MIB)):
        family = ex.Family(attention, False, False, False, SEQ)
        cals.append(_cal(family, "torch", {"forward": act, "loss": act + 5 * LOGITS, "backward": act + 2 * LOGITS,
                                           "optimizer": 0}, (0.2, 1.2)))
        cals.append(_cal(family, "fusedce", {"forward": act, "loss": act + 0.1 * LOGITS, "backward": act + 0.3 * LOGITS,
                                             "optimizer": 0}, (0.05, 0.1)))
    return cals


def _user_readings(cals, attention, batch, active, extra_per_token, slack_in_l):
    """The readings of a *different* implementation (not a calibration the judging has): ours
    plus ``extra_per_token`` bytes of activations, with the allocator's slack at
    ``slack_in_l`` = (naive, fused) logits copies, on a context of 500 MiB."""
    by = {(c.family.attention, c.backend): c for c in cals}

    def reading(backend, slack):
        allocated, _ = by[(attention, backend)].predict(batch, extra_per_token * SEQ)
        return 500 * MIB + allocated + slack * logits_bytes(batch, SEQ, VOCAB)

    naive = reading("torch", slack_in_l[0])
    fused = reading("fusedce", slack_in_l[1]) if active else naive
    return ex.Observation(naive / MIB, fused / MIB, 24, tied=False, seq=SEQ, checkpointing=False, eval_step=False)


def _ranked(cals, obs, stand_in=True):
    terms = device_terms(obs, cals, cuda=True, noise=2 * MIB, stand_in=stand_in, vocab=VOCAB,
                         layers_hidden=LAYERS_HIDDEN)
    return ex_ver.build_hypotheses(obs, cals, terms)


@pytest.mark.parametrize("attention, batch, active", [("sdpa", 18, True), ("eager", 8, True), ("sdpa", 16, False)])
def test_a_heavier_implementation_keeps_the_truth_and_rules_out_the_other_fused_state(attention, batch, active):
    cals = _world()
    heavier = 0.95 * IMPLEMENTATION_SPREAD * LAYERS_HIDDEN  # near the measured spread
    obs = _user_readings(cals, attention, batch, active, heavier, (1.0, 0.08))
    ranked = _ranked(cals, obs)
    truth = next(h for h in ranked if h.family.attention == attention and h.fused_active == active)
    assert truth.consistent, truth.why
    assert truth.batch_range[0] <= batch <= truth.batch_range[1]
    wrong = next(h for h in ranked if h.family.attention == attention and h.fused_active != active)
    assert not wrong.consistent and "would save" in wrong.why


def test_without_the_extra_activation_range_the_heavier_implementation_is_ruled_out():
    """The same readings judged as if the model were the user's own: no extra activations are
    allowed, B is pinned higher by the naive reading and the predicted saving misses."""
    cals = _world()
    obs = _user_readings(cals, "sdpa", 18, True, 0.95 * IMPLEMENTATION_SPREAD * LAYERS_HIDDEN, (1.0, 0.08))
    truth = next(h for h in _ranked(cals, obs, stand_in=False) if h.family.attention == "sdpa" and h.fused_active)
    assert not truth.consistent


def test_the_slack_range_is_measured_per_kind_of_step_in_logits_copies():
    ranges = slack_ranges(_world(), VOCAB)
    assert ranges[("torch", "sdpa", False)] == pytest.approx((0.2, 1.2), abs=1e-6)
    assert ranges[("fusedce", "eager", False)] == pytest.approx((0.05, 0.1), abs=1e-6)
    assert slack_ranges(_world(), 0) == {}


def _truths():
    return {row["case"]["name"]: row for row in map(json.loads, (FIXTURE / "truth.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("case", ["sdpa-1024x18-fused", "eager-1024x8-inactive", "sdpa-1024x16-inactive"])
def test_measured_h200_steps_rejudged_keep_the_truth_of_a_gpt2_trained_by_lightning(case, tmp_path):
    from benchmarks.explain_rejudge import rejudge

    truth = _truths()[case]
    known = truth["case"]
    obs = ex.Observation(truth["naive"]["reading"] / MIB, truth["fused"]["reading"] / MIB, 24, tied=False, seq=1024,
                         eval_step=False, fused_larger=truth["fused"]["reading"] > truth["naive"]["reading"])
    e = rejudge(FIXTURE / "explain_steps.jsonl", obs, tmp_path, seqs=(1024,))
    matching = [h for h in e.hypotheses if h.family.attention == known["attention"] and
                h.family.checkpointing == known["checkpointing"] and h.fused_active == known["fused"]]
    assert matching and matching[0].consistent, matching[0].why if matching else e.conclusion
    assert not e.decided  # nothing was confirmed at full size
    if known["fused"]:  # a 7.4 GiB saving: the fused path NOT active is ruled out in every family
        assert not any(h.consistent for h in e.hypotheses if not h.fused_active)


def test_the_stand_in_allowance_is_the_largest_spread_measured_on_the_gpu():
    import json
    from pathlib import Path

    from fusedce_profiler.judgements.explain.allocator import IMPLEMENTATION_SPREAD

    measured = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                           "explain-implementation-spread-h200-2026-12-04" / "spread.json").read_text())
    rows = measured["rows"]
    assert {r["device"] for r in rows} == {"cuda"} and {r["seq"] for r in rows} == {512, 1024, 2048}
    largest = max(r["extra_bytes_per_token_layer_hidden_any_phase"] for r in rows)
    assert IMPLEMENTATION_SPREAD == round(largest, 1)
    assert all(r["extra_bytes_per_token_layer_hidden_any_phase"] >= r["extra_bytes_per_token_layer_hidden"]
               for r in rows)
