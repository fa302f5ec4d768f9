"""parity: identical training runs agree, planted mistakes are caught, the data is learnable."""
import pytest
import torch

from fusedce_profiler.instrument.backends import torch_loss
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce.options import IGNORE_INDEX
from fusedce_profiler.instrument.step.data import MarkovChain
from fusedce_profiler.judgements.parity import CONTROL, ParityCurve, ParitySettings
from fusedce_profiler.judgements.parity_training import run_parity

STEPS = 40


def _settings(backends, **kw):
    fields = dict(config=get_preset("tiny"), backends=backends, steps=STEPS, batch=4, seq=32, mode="fp32",
                  control=False)
    fields.update(kw)
    return ParitySettings(**fields)


# Back-ends with planted mistakes (named module:callable, as a user's back-end would be).
def scaled_loss(hidden, weight, target, bias, **options):
    return 1.1 * torch_loss(hidden, weight, target, bias, _options(options))


def detached_weight(hidden, weight, target, bias, **options):
    return torch_loss(hidden, weight.detach().clone(), target, bias, _options(options))


def dropped_bias(hidden, weight, target, bias, **options):
    return torch_loss(hidden, weight, target, None, _options(options))


def padding_trained(hidden, weight, target, bias, **options):
    return torch_loss(hidden, weight, target.clamp(min=0), bias, _options(options))


def faithful(hidden, weight, target, bias, **options):
    return torch_loss(hidden, weight, target, bias, _options(options))


def _options(options):
    from fusedce.options import LossOptions

    return LossOptions(**options)


def test_fused_backend_agrees_with_torch_and_the_loss_falls():
    report = run_parity(_settings(["fusedce"], steps=80))
    assert report.reference_learned
    ref = report.curves[0]
    assert ref.final_loss() < 0.9 * ref.initial_loss()
    (verdict,) = report.verdicts
    assert verdict.passed, verdict.reasons
    assert verdict.final_loss_rel_diff < 1e-4 and verdict.worst_grad_error < 1e-4
    assert report.passed


@pytest.mark.parametrize("options", [
    {"config": get_preset("tiny").replace(tie_word_embeddings=True)},
    {"bias": True},
    {"ignore_frac": 0.3},
    {"reduction": "sum"},
])
def test_faithful_backend_passes_with_tied_bias_padding_and_sum(options):
    report = run_parity(_settings([f"{__name__}:faithful"], **options))
    assert report.passed, report.verdicts
    checks = report.curves[1].grad_checks
    assert [c.step for c in checks] == [0, STEPS // 2, STEPS - 1]
    if options.get("bias"):
        assert all(c.bias is not None for c in checks)


@pytest.mark.parametrize("backend, options, reason", [
    ("scaled_loss", {}, "final loss"),
    ("detached_weight", {}, "lm_head gradient"),
    ("detached_weight", {"config": get_preset("tiny").replace(tie_word_embeddings=True)}, "lm_head gradient"),
    ("dropped_bias", {"bias": True}, "bias gradient"),
    ("padding_trained", {"ignore_frac": 0.3}, "gradient"),
])
def test_planted_mistake_is_flagged_as_divergence(backend, options, reason):
    report = run_parity(_settings([f"{__name__}:{backend}"], **options))
    (verdict,) = report.verdicts
    assert verdict.passed is False
    assert any(reason in r for r in verdict.reasons), verdict.reasons
    assert not report.passed


def nan_loss(hidden, weight, target, bias, **options):
    return torch_loss(hidden, weight, target, bias, _options(options)) * float("nan")


def test_nan_loss_is_a_failure():
    report = run_parity(_settings([f"{__name__}:nan_loss"]))
    assert report.verdicts[0].passed is False
    assert "not finite" in report.verdicts[0].reasons[0]


def test_unavailable_backend_is_skipped_not_failed():
    report = run_parity(_settings(["no_such_module_xyz:loss"]))
    assert report.verdicts[0].passed is None and report.passed


def test_markov_batches_are_deterministic_and_padded_as_asked():
    chain = MarkovChain(64, seed=1)
    a, b = chain.batch(5, 8, 32, ignore_frac=0.3), chain.batch(5, 8, 32, ignore_frac=0.3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(chain.batch(6, 8, 32)[0], a[0])
    ignored = (a[1] == IGNORE_INDEX)
    assert ignored.any() and not ignored[:, 0].any()
    assert torch.equal(a[0][ignored], torch.zeros_like(a[0][ignored]))
    assert 0 < chain.entropy_rate() < torch.log(torch.tensor(4.0)).item() + 1e-9


@pytest.mark.parametrize("kw, message", [({"steps": 5}, "steps"), ({"mode": "fp16"}, "mode"),
                                         ({"reduction": "none"}, "reduction"), ({"check_steps": [99]}, "check_steps"),
                                         ({"backends": []}, "backends")])
def test_settings_reject_bad_values(kw, message):
    with pytest.raises(ValueError, match=message):
        _settings(kw.pop("backends", ["fusedce"]), **kw)


def test_curve_gap_finds_the_largest_gap_its_step_and_the_steps_above_the_tolerance():
    from fusedce_profiler.judgements.parity import ParityCurve, curve_gap

    reference = ParityCurve("torch", losses=[4.0, 3.0, 2.0, 2.0, 1.0])
    curve = ParityCurve("fusedce", losses=[4.0, 3.3, 2.4, 2.02, 1.0])
    gap = curve_gap(curve, reference, threshold=0.05)
    assert gap.peak == pytest.approx(0.2) and gap.peak_step == 2
    assert gap.diffs == pytest.approx([0.0, 0.1, 0.2, 0.01, 0.0])
    assert (gap.above, gap.first_above, gap.last_above) == (2, 1, 2)
    assert gap.higher == 3  # steps 1, 2 and 3; equal losses count as not higher
    assert curve_gap(ParityCurve("liger"), reference, 0.05) is None


def test_the_reference_and_each_backend_are_reported_as_they_finish_and_the_rest_are_named_not_run():
    seen = []
    report = run_parity(_settings(["fusedce", f"{__name__}:faithful"], steps=10),
                        on_curve=lambda partial: seen.append(([c.backend for c in partial.curves],
                                                              list(partial.not_run), len(partial.verdicts))))
    assert seen == [(["torch"], ["fusedce", f"{__name__}:faithful"], 0),
                    (["torch", "fusedce"], [f"{__name__}:faithful"], 1),
                    (["torch", "fusedce", f"{__name__}:faithful"], [], 2)]
    assert report.not_run == [] and all(c.seconds is not None and c.seconds > 0 for c in report.curves)
    assert report.verdicts[0].max_step_rel_diff_step is not None


def test_a_run_stopped_after_the_reference_keeps_it_and_its_page_and_resume_trains_the_rest(tmp_path):
    from fusedce_profiler.judgements.parity import load_parity_report, save_parity_report
    from fusedce_profiler.judgements.parity_training import train_curve
    from fusedce_reports.parity_report import write_parity_report

    settings = _settings(["fusedce"], steps=10)
    trained = []

    def stopped_after_the_reference(name, perturbed):
        if trained:
            raise KeyboardInterrupt  # Ctrl-C while the first back-end trains
        trained.append(name)
        return train_curve(settings, name, MarkovChain(settings.config.vocab_size, seed=settings.seed))

    def save(partial):
        save_parity_report(tmp_path, partial)
        write_parity_report(tmp_path)

    with pytest.raises(KeyboardInterrupt):
        run_parity(settings, on_curve=save, train=stopped_after_the_reference)
    partial = load_parity_report(tmp_path)
    assert [c.backend for c in partial.curves] == ["torch"] and partial.not_run == ["fusedce"]
    assert "fusedce" in (tmp_path / "summary.md").read_text()
    resumed = run_parity(settings, finished=partial,
                         train=lambda name, perturbed: trained.append(name) or train_curve(
                             settings, name, MarkovChain(settings.config.vocab_size, seed=settings.seed)))
    assert trained == ["torch", "fusedce"] and resumed.curves[0].losses == partial.curves[0].losses
    assert [v.backend for v in resumed.verdicts] == ["fusedce"]


def test_the_seed_changes_initialisation_and_data_and_is_repeatable():
    runs = {seed: run_parity(_settings(["fusedce"], steps=10, seed=seed)).curves[0].losses for seed in (0, 1)}
    assert runs[0] != runs[1]
    assert run_parity(_settings(["fusedce"], steps=10, seed=1)).curves[0].losses == runs[1]


def test_unrounded_logits_control_differs_from_torch_by_the_logits_rounding_alone():
    from fusedce.options import LossOptions
    from fusedce_profiler.instrument.step.losses import unrounded_logits_loss

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 32, generator=gen, requires_grad=True)
    weight = torch.randn(200, 32, generator=gen, requires_grad=True)
    target = torch.randint(0, 200, (64,), generator=gen)
    exact = torch_loss(hidden, weight, target, None, LossOptions())
    assert unrounded_logits_loss(hidden, weight, target) == exact  # no autocast: torch's loss itself
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = torch_loss(hidden, weight, target, None, LossOptions())
        control = unrounded_logits_loss(hidden, weight, target)
    reference = torch_loss(hidden.bfloat16().double(), weight.bfloat16().double(), target, None, LossOptions())
    assert control.dtype == torch.float32
    assert abs(control.item() - reference.item()) < 1e-5 < abs(rounded.item() - reference.item())
    control.backward()
    assert hidden.grad is not None and weight.grad is not None and weight.grad.dtype == torch.float32


def test_the_control_starts_one_rounding_away_from_torch():
    """The perturbed-torch control's initial weights differ from torch's by about one fp32
    rounding (relative), and by something (it is a different run)."""
    from fusedce_profiler.judgements.parity_training import build_model, perturb_

    settings = _settings(["fusedce"])
    base, moved = build_model(settings), build_model(settings)
    perturb_(moved, settings)
    unit = torch.finfo(torch.float32).eps / 2
    changed = 0
    for p, q in zip(base.parameters(), moved.parameters()):
        rel = ((q - p).abs() / p.abs().clamp_min(1e-30)).max().item()
        assert rel <= 8 * unit
        changed += int(not torch.equal(p, q))
    assert changed > 0


def _curve(name, final):
    return ParityCurve(name, losses=[4.0] * 18 + [final] * 2)


@pytest.mark.parametrize("noise_floor,passes", [(None, False), (0.01, False), (0.05, True)],
                         ids=["no-control", "small-floor", "large-floor"])
def test_final_loss_limit_is_the_tolerance_or_three_times_the_control(noise_floor, passes):
    """A 10% final-loss gap fails against the 2% tolerance and against 3 × a 1% floor, and
    passes against 3 × a 5% floor (the run is that noisy)."""
    from fusedce_profiler.judgements.parity import judge

    settings = _settings(["fusedce"])
    verdict = judge(settings, _curve("fusedce", 1.1), _curve("torch", 1.0), noise_floor)
    assert verdict.passed is passes
    assert verdict.loss_limit == pytest.approx(max(0.02, 3 * (noise_floor or 0)))
    if not passes:
        assert "relative difference 1.00e-01" in verdict.reasons[0]


def test_a_run_with_the_control_judges_against_its_floor_and_still_catches_a_wrong_loss():
    report = run_parity(_settings(["fusedce", f"{__name__}:scaled_loss"], steps=20, control=True))
    assert [c.backend for c in report.curves] == ["torch", CONTROL, "fusedce", f"{__name__}:scaled_loss"]
    floor = report.noise_floor
    assert floor is not None and floor < 1e-3  # fp32, 20 steps: the trajectories have not separated
    by_name = {v.backend: v for v in report.verdicts}
    assert by_name["fusedce"].passed and by_name["fusedce"].loss_limit == pytest.approx(0.02)
    assert by_name[f"{__name__}:scaled_loss"].passed is False
    assert not report.passed
