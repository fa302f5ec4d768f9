"""The recorder inside a plain loop and inside the Lightning and Hugging Face callbacks.

The callbacks' logic (the phases, the evaluation passes, the folder) is driven here through
the hooks in the order Lightning and the Trainer call them, on a stand-in for the framework's
base class, so it is tested where neither package is installed; the last tests run the real
frameworks when they are (skipped otherwise).
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile import StepRecorder, record_step
from fusedce_profile._lightning import make_callback_class
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.recording.recorder import NOOP
from fusedce_profiler.instrument.recording.records import PHASES, load_recorded_steps
from tests.doctor_models import VOCAB, WrappedHeadLM

runner = CliRunner()
ORIGINAL_BACKWARD = torch.Tensor.backward


def _batch(seed: int, batch: int = 2, seq: int = 16) -> dict:
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def _loss(model, batch) -> torch.Tensor:
    logits = model(batch["input_ids"])[:, :-1]
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_only_the_named_steps_are_recorded_and_the_others_install_nothing(tmp_path):
    torch.manual_seed(0)
    model = WrappedHeadLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = StepRecorder(model, tmp_path / "run", steps=(1, 3), label="naive", trace=False, report=False)
    seen = {}
    for i in range(5):
        ctx = recorder.step()
        with ctx:
            seen[i] = (ctx is NOOP, _hooks(model), torch.Tensor.backward is ORIGINAL_BACKWARD)
            _loss(model, _batch(i)).backward()
            optimizer.step()
            optimizer.zero_grad()
    recorder.close()
    assert {i for i, (noop, _, _) in seen.items() if not noop} == {1, 3}
    for i in (0, 2, 4):  # unnamed: no hook, Tensor.backward untouched
        assert seen[i] == (True, 0, True)
    for i in (1, 3):  # named: the hooks are there while it runs, and gone after
        assert seen[i][1] > 0 and seen[i][2] is False
    assert _hooks(model) == 0 and torch.Tensor.backward is ORIGINAL_BACKWARD
    loaded = load_recorded_steps(tmp_path / "run")
    assert [r.step for r in loaded.records] == [1, 3] and not loaded.problems


def test_a_recorded_step_has_its_phases_in_order_the_head_and_the_batch(tmp_path):
    torch.manual_seed(0)
    model = WrappedHeadLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with record_step(model, tmp_path / "one", step=2, label="naive", trace=False, report=False) as recorder:
        loss = _loss(model, _batch(0, batch=3, seq=12))
        loss.backward()
        optimizer.step()
    (record,) = recorder.records
    assert [p.name for p in record.phases] == list(PHASES)
    assert record.step == 2 and (record.batch, record.seq, record.vocab) == (3, 12, VOCAB)
    assert record.head["path"] == "head.inner" and record.head["bias"] is None and record.head_called
    assert record.peak_allocated > 0 and record.peak_reserved is None  # the CPU has no caching allocator
    assert record.notes == []


def test_the_folder_renders_with_report_dir(tmp_path):
    torch.manual_seed(0)
    model = WrappedHeadLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    folder = tmp_path / "traced"
    recorder = StepRecorder(model, folder, steps=(1,), label="naive", report=False)  # trace on: attribution
    for i in range(2):
        with recorder.step():
            _loss(model, _batch(i)).backward()
            optimizer.step()
            optimizer.zero_grad()
    recorder.close()
    assert not (folder / "summary.md").exists()
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    text = (folder / "summary.md").read_text()
    assert "naive step 1" in text and (folder / store.ENVIRONMENT_FILE).is_file()
    assert load_recorded_steps(folder).records[0].attribution is not None


def test_a_folder_holding_a_recording_is_not_overwritten_without_force(tmp_path):
    model = WrappedHeadLM()
    with record_step(model, tmp_path / "r", step=0, trace=False, report=False):
        _loss(model, _batch(0)).backward()
    with pytest.raises(FileExistsError, match="force=True"):
        StepRecorder(model, tmp_path / "r", steps=(0,))
    StepRecorder(model, tmp_path / "r", steps=(0,), append=True).close()


# --- the Lightning callback, driven hook by hook -------------------------------------------------

class _Trainer:
    """What the callback reads of a Lightning Trainer."""

    def __init__(self, root: Path) -> None:
        self.global_step, self.sanity_checking, self.is_global_zero = 0, False, True
        self.log_dir, self.default_root_dir = str(root), str(root)


@pytest.fixture()
def lightning_callback(monkeypatch):
    base = types.ModuleType("stand_in_lightning")
    base.Callback = type("Callback", (), {})
    monkeypatch.setitem(sys.modules, "stand_in_lightning", base)
    return make_callback_class("stand_in_lightning")


def _lightning_fit(callback, model, trainer, steps: int, validate_after: set[int]) -> None:
    """Trainer.fit's hook order: setup, the sanity check, then per batch start → forward →
    before_backward → backward → before_optimizer_step → step → batch_end, and a validation
    pass after the steps in ``validate_after``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def validate(sanity: bool) -> None:
        trainer.sanity_checking = sanity
        callback.on_validation_start(trainer, model)
        with torch.no_grad():
            _loss(model, _batch(99))
        callback.on_validation_end(trainer, model)
        trainer.sanity_checking = False

    callback.setup(trainer, model, "fit")
    validate(sanity=True)
    for i in range(steps):
        batch = _batch(i)
        callback.on_train_batch_start(trainer, model, batch, i)
        loss = _loss(model, batch)
        callback.on_before_backward(trainer, model, loss)
        loss.backward()
        callback.on_before_optimizer_step(trainer, model, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, model, loss, batch, i)
        if i in validate_after:
            validate(sanity=False)
    callback.teardown(trainer, model, "fit")


def test_lightning_callback_records_its_step_under_the_log_dir_with_the_passes_before_it(tmp_path, lightning_callback):
    torch.manual_seed(0)
    model = WrappedHeadLM()
    trainer = _Trainer(tmp_path / "logs")
    callback = lightning_callback(steps=(2,), label="naive", trace=False)
    _lightning_fit(callback, model, trainer, steps=4, validate_after={0})
    folder = tmp_path / "logs" / "fusedce-profile"
    assert callback.folder == folder
    (record,) = load_recorded_steps(folder).records
    assert record.step == 2 and [p.name for p in record.phases] == list(PHASES) and record.loss is not None
    assert [(p.kind, p.before_step) for p in record.passes_before] == [("sanity check", 0), ("validation", 1)]
    assert all(p.reserved_before is None and p.raised_reserved is None for p in record.passes_before)
    text = (folder / "summary.md").read_text()  # report=True: rendered after the step
    assert "2 evaluation pass(es) ran before it" in " ".join(text.split())
    assert "reserved figure is unavailable on the CPU" in " ".join(text.split())


def test_lightning_callback_on_another_rank_writes_nothing(tmp_path, lightning_callback):
    trainer = _Trainer(tmp_path / "logs")
    trainer.is_global_zero = False
    callback = lightning_callback(steps=(0,), trace=False)
    _lightning_fit(callback, WrappedHeadLM(), trainer, steps=1, validate_after=set())
    assert callback.recorder is None and not (tmp_path / "logs").exists()


# --- the Hugging Face callback, driven hook by hook -----------------------------------------------

@pytest.fixture()
def hf_callback(monkeypatch):
    if importlib.util.find_spec("transformers") is None:
        stand_in = types.ModuleType("transformers")
        stand_in.TrainerCallback = type("TrainerCallback", (), {})
        monkeypatch.setitem(sys.modules, "transformers", stand_in)
    monkeypatch.delitem(sys.modules, "fusedce_profile.hf", raising=False)
    module = importlib.import_module("fusedce_profile.hf")
    yield module.StepRecorderCallback
    sys.modules.pop("fusedce_profile.hf", None)


def test_hf_callback_records_its_step_under_the_output_dir(tmp_path, hf_callback):
    torch.manual_seed(0)
    model = WrappedHeadLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    args = types.SimpleNamespace(output_dir=str(tmp_path / "out"))
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback = hf_callback(steps=(1,), label="fused", fused=True, trace=False)
    callback.on_train_begin(args, state, None, model=model)
    for i in range(3):
        callback.on_step_begin(args, state, None)
        _loss(model, _batch(i)).backward()
        callback.on_pre_optimizer_step(args, state, None)
        optimizer.step()
        optimizer.zero_grad()
        state.global_step += 1
        callback.on_step_end(args, state, None)
        if i == 0:
            callback.on_evaluate(args, state, None)
    callback.on_train_end(args, state, None)
    folder = tmp_path / "out" / "fusedce-profile"
    (record,) = load_recorded_steps(folder).records
    assert record.step == 1 and record.fused is True and [p.name for p in record.phases] == list(PHASES)
    assert [(p.kind, p.before_step) for p in record.passes_before] == [("evaluation", 1)]
    assert runner.invoke(app, ["report", str(folder)]).exit_code == 0


# --- the real frameworks, when installed ----------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "own_run"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_lightning_example_trains_two_steps_and_its_folder_renders(tmp_path):
    if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("lightning is not installed (pip install \"fusedce[lightning]\")")
    out = _example("lightning_tiny").main(["--out", str(tmp_path / "pl"), "--steps", "1", "--max-steps", "2",
                                           "--precision", "bf16-mixed"])
    (record,) = load_recorded_steps(out).records
    assert record.step == 1 and record.autocast == "bf16"
    assert {p.kind for p in record.passes_before} >= {"sanity check"}
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0


@pytest.mark.slow
def test_hf_example_trains_and_its_folder_renders(tmp_path):
    for name in ("transformers", "accelerate"):  # the Trainer needs both
        pytest.importorskip(name, reason=f"{name} is not installed (pip install \"fusedce[hf]\")")
    out = _example("hf_tiny").main(["--out", str(tmp_path / "hf"), "--steps", "1"])
    assert [r.step for r in load_recorded_steps(out).records] == [1]
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0


def test_plain_loop_example_records_steps_2_and_5_of_both_runs(tmp_path):
    out = _example("plain_loop").main(["--out", str(tmp_path / "plain"), "--batch", "2", "--seq", "16",
                                       "--device", "cpu"])
    records = load_recorded_steps(out).records
    assert [(r.label, r.step) for r in records] == [("naive", 2), ("naive", 5), ("fused", 2), ("fused", 5)]
    assert "fused peaks at" in (out / "summary.md").read_text()


@pytest.mark.parametrize("steps", [("a",), "2", 3.5, (True,), (-1,)])
def test_steps_that_are_not_step_indices_are_refused_naming_the_argument(tmp_path, steps):
    with pytest.raises(ValueError, match=r"^steps must be 0-based step indices"):
        StepRecorder(torch.nn.Linear(4, 4), tmp_path / "run", steps=steps)
    assert not (tmp_path / "run").exists()
