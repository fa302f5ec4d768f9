"""The model report: findings and tables are pure functions of the results."""
import dataclasses

from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.instrument.protocol import Phase
from fusedce_reports.model_report import breakdown_table, findings, model_table
from fusedce_reports.plots.model import plot_breakdown, plot_reserved
from fusedce_profiler.instrument.step.jobs import ModelJob, ModelResult
from fusedce_profiler.instrument.step.memory import Part, StepMemory

GIB = 1 << 30


def _result(backend, peak, loss_extra, *, eval_step=False, reserved=None, phase="loss", activations=8 * GIB):
    static = 2 * GIB
    parts = [Part("parameters", GIB // 2), Part("optimizer state", GIB), Part("batch", 0),
             Part("other at step start", static - GIB // 2 - GIB)]
    parts += [Part("activations", activations), Part("loss region", peak - static - activations)]
    memory = StepMemory(
        source="cuda-allocator", parameters=GIB // 2, gradients=GIB // 2, optimizer_state=GIB, batch=0,
        static=static, activations=activations, saved_tensors=activations, weight_copies=0, loss_extra=loss_extra,
        peak=peak, peak_phase=phase, composition=parts,
        phases=[Phase("loss", static + activations, static + activations, peak)],
        peak_reserved=reserved or peak + GIB // 4, context=GIB // 2,
        smi_peak=(reserved or peak + GIB // 4) + GIB // 2)
    job = ModelJob(get_preset("user-gpt"), backend, 32, 1024, eval_step=eval_step)
    return ModelResult(job=job, status="ok", memory=memory, time_ms=100.0)


def test_findings_explain_a_saving_and_claim_no_inactive_fused_path_without_the_detector():
    torch_run = _result("torch", 20 * GIB, 10 * GIB)
    good = _result("fusedce", 11 * GIB, GIB)
    inactive = _result("liger", 20 * GIB - GIB // 2, 9 * GIB)
    text = findings([torch_run, good, inactive])
    assert "torch peaks at 20.0 GiB" in text[0] and "50% of the peak" in text[0]
    assert "fusedce" in text[1] and "saves 9.00 GiB (45%)" in text[1]
    assert "not active" not in text[1]
    assert "liger" in text[2] and "not active" not in text[2] and "logits detector did not run" in text[2]


def test_findings_say_when_the_loss_was_a_small_part_of_the_peak():
    torch_run = _result("torch", 20 * GIB, 2 * GIB, activations=16 * GIB)
    fused = _result("fusedce", 19 * GIB - GIB // 2, GIB // 2, activations=16 * GIB)
    text = findings([torch_run, fused])
    assert "loss region adds 2.00 GiB (10%) to its peak: no loss can save more than that here" in text[1]


def test_findings_show_what_an_evaluation_pass_leaves_reserved():
    plain = _result("torch", 20 * GIB, 10 * GIB, reserved=21 * GIB)
    after_eval = _result("torch", 20 * GIB, 10 * GIB, eval_step=True, reserved=30 * GIB)
    text = findings([plain, after_eval])
    assert "torch+eval" in text[1] and "30.0 GiB" in text[1] and "keeps the evaluation's high-water mark" in text[1]


def test_tables_and_plots_render(tmp_path):
    results = [_result("torch", 20 * GIB, 10 * GIB), _result("fusedce", 11 * GIB, GIB),
               ModelResult(job=ModelJob(get_preset("user-gpt"), "cce", 32, 1024), status="skipped",
                           message="cut-cross-entropy: not installed")]
    table = model_table(results)
    assert list(table["saving vs torch"]) == ["–", "9.00 GiB (45%)", "–"]
    assert table["status"].iloc[2].startswith("skipped: cut-cross-entropy")
    assert list(table["replaced"]) == ["nothing", "nothing", "–"]
    from fusedce_profiler.instrument.backends import Replacement

    results[1].replaced = [Replacement("LM-head/loss", "the loss"), Replacement("norms", "RMSNorm.forward", 5)]
    assert model_table(results)["replaced"].iloc[1] == "the loss (LM-head/loss); RMSNorm.forward ×5 (norms)"
    parts = breakdown_table(results[0])
    assert parts["bytes"].iloc[-1] == "**20.0 GiB**"
    assert plot_breakdown(results, tmp_path / "b.png").stat().st_size > 5000
    assert plot_reserved(results, tmp_path / "r.png").stat().st_size > 5000


def test_results_round_trip_through_json():
    result = _result("fusedce", 11 * GIB, GIB)
    again = ModelResult.from_dict(dataclasses.asdict(result))
    assert again == result


def test_stored_strings_cannot_break_the_markdown_of_the_report():
    from fusedce_reports.model_report import render_model_markdown

    planted = "my|loss*`x`:make"
    results = [_result("torch", 20 * GIB, 10 * GIB), _result(planted, 11 * GIB, GIB)]
    results[1].memory.peak_phase = "loss|*`"
    text = render_model_markdown(results, [], {"torch": "2.1 ```` |*"}, [])
    assert planted not in text and r"my\|loss\*\`x\`:make" in text
    assert r"## my\|loss\*\`x\`:make: composition of the peak" in text
    assert r"**peak (loss\|\*\` phase)**" in text
    # every table row keeps its column count: no planted | splits a cell
    for table in text.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        if rows:
            counts = {line.replace("\\|", "").count("|") for line in rows}
            assert len(counts) == 1, table
    fence = next(line for line in text.splitlines() if line.startswith("`````"))
    assert "2.1 ```` |*" in text and text.count(fence) == 2


def test_the_torch_finding_names_the_activation_kinds_not_a_lump():
    from fusedce_profiler.instrument.tracing.attribution import Attribution, KindBytes
    from fusedce_reports.attribution_tables import activation_split

    kinds = [KindBytes("parameters", 2 * GIB), KindBytes("attention scores/probabilities", 6 * GIB, blocks=8),
             KindBytes("MLP", 2 * GIB), KindBytes("norms", GIB), KindBytes("LM-head input/logits", GIB // 2),
             KindBytes("embedding", GIB // 4), KindBytes("other activations", GIB // 4)]
    a = Attribution(sum(k.bytes for k in kinds), "loss", kinds, [], [], 0, 32 * 1024, 50304, 32, 1024, [12],
                    layers=12)
    split = activation_split(a)
    assert split.startswith("attention scores/probabilities 6.00 GiB (50%), MLP 2.00 GiB (17%), norms")
    assert "the other 2 kinds 512 MiB (4%)" in split
    torch_run = _result("torch", 12 * GIB, GIB)
    torch_run.attribution = a
    text = findings([torch_run])[0]
    assert "the activations are attention scores/probabilities 6.00 GiB" in text
    assert "32 × 12 × 1024 × 1024 in bf16" in text


def test_the_page_says_the_precision_each_run_used():
    """The page said "fp32 master weights under bf16 autocast" of every run, an fp32 one included."""
    from fusedce_reports.model_report import render_model_markdown

    amp, fp32 = _result("torch", 20 * GIB, 10 * GIB), _result("fusedce", 11 * GIB, GIB)
    fp32.job = dataclasses.replace(fp32.job, mode="fp32")
    assert "after a warm-up step, fp32 master weights under bf16 autocast, each" in render_model_markdown(
        [amp], [], {}, [])
    page = render_model_markdown([fp32], [], {}, [])
    assert "after a warm-up step, fp32 throughout (no autocast), each" in page and "autocast, each" not in page
    assert "bf16 autocast; fp32 throughout" in render_model_markdown([amp, fp32], [], {}, [])
