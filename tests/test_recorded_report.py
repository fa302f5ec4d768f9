"""The recorded-step report's sentences about evaluation passes, from stored records alone
(the CUDA figures are written into the records: the sentences are a pure function of them)."""
from __future__ import annotations

from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument.recording.records import EvalPass, PhaseMemory, RecordedStep, append_recorded_step
from fusedce_reports.recorded_report import pass_sentences

MIB = 1 << 20


def _record(passes, *, reserved_at_start=None, peak_reserved=None, device="cuda:0") -> RecordedStep:
    phases = [PhaseMemory("forward", 900 * MIB, 1500 * MIB, 1600 * MIB, peak_reserved, None),
              PhaseMemory("backward", 1500 * MIB, 1000 * MIB, 2000 * MIB, peak_reserved, None)]
    return RecordedStep(step=2, label="fused", model="GPT (110 M parameters)", device=device, source="cuda allocator",
                        phases=phases, peak_allocated=2000 * MIB, peak_phase="backward", baseline_allocated=900 * MIB,
                        parameters=400 * MIB, gradients_at_start=0, optimizer_state=800 * MIB, time_ms=50.0,
                        batch=32, seq=1024, tokens=32768, reserved_at_start=reserved_at_start,
                        peak_reserved=peak_reserved, smi_peak=(peak_reserved + 500 * MIB) if peak_reserved else None,
                        passes_before=passes)


def test_a_validation_pass_that_raised_reserved_is_named_with_its_figures():
    passes = [EvalPass("sanity check", 0, 1000 * MIB, 1002 * MIB, 1000 * MIB, 1002 * MIB),
              EvalPass("validation", 1, 3000 * MIB, 9000 * MIB, 3000 * MIB, 9000 * MIB)]
    (sentence,) = pass_sentences(_record(passes, reserved_at_start=9000 * MIB, peak_reserved=9000 * MIB))
    assert "the validation before it (after 1 training steps) raised" in sentence
    assert "+5.86 GiB" in sentence and "shows what the validation left reserved" in sentence


def test_reserved_left_by_later_training_steps_is_not_blamed_on_an_earlier_pass():
    passes = [EvalPass("sanity check", 0, 500 * MIB, 13600 * MIB, 500 * MIB, 13600 * MIB)]
    (sentence,) = pass_sentences(_record(passes, reserved_at_start=27900 * MIB, peak_reserved=27900 * MIB))
    assert "The training steps after it raised reserved further" in sentence
    assert "left reserved, not what this step needs" not in sentence


def test_a_step_that_raised_reserved_itself_says_its_own_peak_sets_nvidia_smi():
    passes = [EvalPass("validation", 1, 3000 * MIB, 9000 * MIB, 3000 * MIB, 9000 * MIB)]
    (sentence,) = pass_sentences(_record(passes, reserved_at_start=9000 * MIB, peak_reserved=12000 * MIB))
    assert "The step itself then raised reserved further" in sentence


def test_passes_that_did_not_raise_reserved_say_so():
    passes = [EvalPass("validation", 1, 3000 * MIB, 3000 * MIB, 3000 * MIB, 3000 * MIB)]
    (sentence,) = pass_sentences(_record(passes, reserved_at_start=3000 * MIB, peak_reserved=3000 * MIB))
    assert "did not raise reserved memory noticeably" in sentence


def test_on_the_cpu_the_reserved_figure_is_unavailable(tmp_path):
    record = _record([EvalPass("sanity check", 0)], device="cpu")
    (sentence,) = pass_sentences(record)
    assert "reserved figure is unavailable on the CPU" in sentence
    append_recorded_step(tmp_path, record)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join((tmp_path / "summary.md").read_text().split())
    assert "reserved figure is unavailable on the CPU" in text and "Evaluation passes before the recorded steps" in text


def test_a_label_with_control_characters_is_drawn_spelled_out(tmp_path, monkeypatch):
    """matplotlib prints a glyph its font lacks, raw, in a warning on the terminal: a label from a
    folder someone sent must reach the plot spelled out."""
    import dataclasses

    from matplotlib.axes import Axes

    from fusedce_reports.recorded_report import plot_phases

    drawn = []
    set_yticks = Axes.set_yticks

    def seen(self, ticks, labels=None, **kwargs):
        drawn.extend(labels or [])
        return set_yticks(self, ticks, labels, **kwargs)

    monkeypatch.setattr(Axes, "set_yticks", seen)
    record = dataclasses.replace(_record([]), label="\x1b]0;PWN\x07\x0eLBL")
    assert plot_phases([record], tmp_path / "phases.png") is not None
    assert drawn and not any(ch in label for label in drawn for ch in "\x1b\x07\x0e")
    assert any("\\x1b]0;PWN\\x07\\x0eLBL" in label for label in drawn)
