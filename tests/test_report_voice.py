"""Reports in one voice: the tie on a wrapper named as doctor names it, one kind of memory with
one name and one colour in every table and plot, one saving ceiling per paragraph, readable
log-axis labels, findings worded for what each back-end is, Lightning's precision names."""
from __future__ import annotations

import dataclasses
import re

import pytest
from matplotlib.colors import to_rgba
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.instrument.models.head import stray_weight_finding
from fusedce_profiler.instrument.models.source import UserSource
from fusedce_profiler.instrument.precision import canonical_mode
from fusedce_profiler.instrument.step.jobs import ModelJob, run_job
from fusedce_profiler.judgements.doctor.checks import check_tie
from fusedce_reports import plots
from fusedce_reports.model_report import findings
from fusedce_reports.palette import kind_colour
from fusedce_reports.plots.model import draw_attribution, draw_breakdown
from fusedce_reports.plots.style import ReadableLogLocator
from planted import cell, frame


@pytest.fixture(scope="module")
def user_torch():
    """One traced torch step of ``examples.user_model`` (a head in a wrapper, the tie assigned
    on the wrapper) on the CPU: its peak is in the optimizer phase."""
    source = UserSource("examples.user_model:build")
    result = run_job(ModelJob(source.config, "torch", 2, 32, device="cpu", source=source.to_dict()))
    assert result.status == "ok", result.message
    return result


def test_the_model_report_names_the_tie_on_the_wrapper_with_the_fix_doctor_prints(user_torch):
    text = " ".join(findings([user_torch]))
    assert "the tie assigned on the wrapper is unused" in text
    assert "Assign the tie to the module the forward uses (head.proj.weight = embedding.weight)" in text
    built = UserSource("examples.user_model:build").build("cpu")
    names = {}
    for name, p in built.module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    verdict, doctor_text = check_tie(built, None, names)
    assert verdict == "fail"
    assert doctor_text == stray_weight_finding("head", "embed.weight", "head.proj.weight", True)
    assert doctor_text in text


def test_what_the_optimizer_allocates_is_optimizer_temporaries_not_activations(user_torch):
    assert user_torch.memory.peak_phase == "optimizer"
    a = user_torch.attribution
    assert a.kind_bytes("optimizer temporaries") > 0
    assert a.kind_bytes("other activations") == 0
    composition = {p.name for p in user_torch.memory.composition}
    assert "optimizer temporaries" in composition
    text = " ".join(findings([user_torch]))
    assert "Largest term at the peak — optimizer temporaries" in text and "inside the optimizer's step()" in text


def _legend_colours(fig) -> dict:
    """Each legend entry's label and the face colour of its patch."""
    legend = fig.axes[0].get_legend()
    return {text.get_text(): tuple(handle.get_facecolor()) for handle, text in zip(legend.legend_handles,
                                                                                 legend.get_texts())}


def test_a_kind_has_one_colour_in_the_breakdown_and_the_attribution(user_torch):
    breakdown = _legend_colours(draw_breakdown([user_torch]))
    attribution = _legend_colours(draw_attribution([user_torch]))
    shared = set(breakdown) & set(attribution)
    assert "optimizer temporaries" in shared and "parameters" in shared
    for kind in shared:
        assert breakdown[kind] == attribution[kind] == pytest.approx(to_rgba(kind_colour(kind))), kind


def test_every_paragraph_states_one_saving_ceiling_and_all_state_the_same(user_torch):
    compiled = dataclasses.replace(user_torch, job=dataclasses.replace(user_torch.job, backend="torch-compile"))
    paragraphs = findings([user_torch, compiled])
    ceilings = [re.findall(r"([\d.]+ \w?i?B) \((\d+%)\)[^.:]*: no loss can save more than that", p) for p in paragraphs]
    assert all(len(c) <= 1 for c in ceilings), paragraphs
    stated = {c[0] for c in ceilings if c}
    assert len(stated) == 1, stated
    assert not any("can save more than" in p and not c for p, c in zip(paragraphs, ceilings))


def test_torch_compile_materialising_its_logits_is_not_called_an_inactive_fused_path(user_torch):
    compiled = dataclasses.replace(user_torch, job=dataclasses.replace(user_torch.job, backend="torch-compile"))
    line = next(p for p in findings([user_torch, compiled]) if p.startswith("torch-compile"))
    assert "fused path is not active" not in line
    assert "it is not a fused loss" in line
    wrapper = dataclasses.replace(user_torch, job=dataclasses.replace(user_torch.job, backend="pkg:my_fused_loss"))
    line = next(p for p in findings([user_torch, wrapper]) if p.startswith("pkg:my_fused_loss"))
    assert "the fused path is not active" in line


def test_a_log_time_axis_labels_at_least_four_readable_values_in_view():
    narrow = [t for t in ReadableLogLocator().tick_values(3050, 3650) if 3050 <= t <= 3650]
    assert narrow == pytest.approx([3100, 3200, 3300, 3400, 3500, 3600])
    assert [t for t in ReadableLogLocator().tick_values(1, 1000) if 1 <= t <= 1000][:4] == [1, 2, 5, 10]
    fig = plots.draw_time(frame(cell("torch", 1024, 10, time_ms=3080.0), cell("fusedce", 1024, 5, time_ms=3610.0),
                                cell("torch", 2048, 20, time_ms=3300.0)))
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = sorted(ax.get_ylim())
    labelled = [t for t in ax.yaxis.get_majorticklocs() if low <= t <= high]
    assert len(labelled) >= 4, (low, high, labelled)
    texts = [ax.yaxis.get_major_formatter()(t, 0) for t in labelled]
    assert all(text.endswith(" s") for text in texts), texts


@pytest.mark.parametrize(("name", "mode"), [("bf16-mixed", "amp-bf16"), ("32-true", "fp32"), ("32", "fp32"),
                                            ("bf16-true", "bf16"), ("16-mixed", "amp-fp16"), ("fp32", "fp32")])
def test_lightning_precision_names_are_the_modes_they_stand_for(name, mode):
    assert canonical_mode(name) == mode
    assert GridSpec(tokens=(8,), vocab=(16,), hidden=(8,), backends=("torch",), modes=(name,), device="cpu").modes == (mode,)


def test_a_training_job_takes_lightnings_name_and_refuses_16_mixed_naming_what_it_is():
    source = UserSource("examples.user_model:build")
    assert ModelJob(source.config, "torch", 2, 8, device="cpu", mode="bf16-mixed", source=source.to_dict()).mode == "amp-bf16"
    with pytest.raises(ValueError, match="Lightning's name for amp-fp16") as refused:
        ModelJob(source.config, "torch", 2, 8, device="cpu", mode="16-mixed", source=source.to_dict())
    assert "(" not in str(refused.value).split("choose one of")[1].split("(")[0]


def test_an_unknown_mode_is_refused_in_one_line_listing_the_names_without_a_python_tuple():
    result = CliRunner().invoke(app, ["model", "--mode", "bf16-mixd", "--device", "cpu"])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "amp-bf16, bf16, fp32" in message or "amp-bf16, amp-fp16, bf16, fp32" in message
    assert "bf16-mixed = amp-bf16" in message
    assert "('" not in message
    result = CliRunner().invoke(app, ["doctor", "--mode", "16-mixed", "--device", "cpu",
                                      "--loss", "examples.doctor_losses:fused_loss"])
    assert result.exit_code == 2 and "amp-fp16" in " ".join(result.output.split())
