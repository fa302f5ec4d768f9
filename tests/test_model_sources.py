"""Model sources: the built-in GPT, Hugging Face models from a config, a user's factory; the
head found and the parameter its forward uses; liger-patched (a fake liger) on the CPU."""
import sys
from pathlib import Path

import pytest
import torch

from fusedce_profiler.instrument.models.head import locate_head
from fusedce_profiler.instrument.models.source import HFSource, UserSource
from fusedce_profiler.instrument.step.jobs import ModelJob, run_job

FAKE_LIGER = Path(__file__).parent / "fixtures" / "fake_liger"
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 384, "tie_word_embeddings": False,
         "max_position_embeddings": 256, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 384, "n_positions": 256,
        "bos_token_id": None, "eos_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def _job(source, backend="torch", attention="sdpa", **kw):
    return ModelJob(source.config, backend, 2, 32, device="cpu", attention=attention, source=source.to_dict(), **kw)


def test_user_factory_with_a_wrapped_head_and_a_tie_assigned_on_the_wrapper_is_found_untied():
    source = UserSource("examples.user_model:build")
    model = source.build("cpu").module
    head = locate_head(model, vocab=source.config.vocab_size)
    assert head.info.path == "head.proj" and head.info.weight == "head.proj.weight"
    assert head.weight is model.head.proj.weight and not head.info.tied
    assert source.config.vocab_size == 512 and source.config.hidden_size == 64


def test_head_path_given_explicitly_names_the_wrapper_and_says_the_tie_is_unused():
    source = UserSource("examples.user_model:build", head_path="head")
    head = locate_head(source.build("cpu").module, vocab=512, head_path="head")
    assert head.info.weight == "head.proj.weight" and not head.info.tied
    assert any("tie assigned on the wrapper is unused" in n for n in head.info.notes)


def test_user_model_trains_with_torch_and_fusedce_and_the_fused_loss_reads_the_head_input():
    source = UserSource("examples.user_model:build")
    for backend in ("torch", "fusedce"):
        result = run_job(_job(source, backend))
        assert result.status == "ok", result.message
        assert result.head.weight == "head.proj.weight"
        assert abs(result.attribution.relative_gap) <= 0.02


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("config, tied", [(LLAMA, False), (GPT2, True)])
def test_hf_config_builds_with_its_head_and_tie(config, tied, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(config))
    source = HFSource.from_reference(str(tmp_path), head_path=None)
    built = source.build("cpu", attention="eager")
    assert built.head.info.path == "lm_head" and built.head.info.tied is tied
    assert built.logits_of(built.call(torch.zeros(1, 8, dtype=torch.long))).shape == (1, 8, 384)


@pytest.mark.slow
@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_hf_attribution_sums_to_the_measured_peak_within_2_percent(config, attention):
    source = HFSource(config, name=config["model_type"])
    for backend in ("torch", "fusedce"):
        result = run_job(_job(source, backend, attention))
        assert result.status == "ok", result.message
        a = result.attribution
        assert abs(a.relative_gap) <= 0.02, (backend, a.peak_bytes, a.metered_peak_bytes)
        assert a.kind_bytes("MLP") > 0 and a.kind_bytes("norms") >= 0 and a.kind_bytes("attention (other)") > 0
    if attention == "eager":
        assert result.attribution.kind_bytes("attention scores/probabilities") > 0


def test_hf_gradient_checkpointing_and_pure_bf16_run():
    source = HFSource(LLAMA, name="llama")
    result = run_job(_job(source, "fusedce", checkpointing=True, mode="bf16"))
    assert result.status == "ok", result.message


def test_liger_patched_records_norms_mlp_and_loss_and_the_report_separates_the_loss_saving(monkeypatch, tmp_path):
    from fusedce_profiler.instrument.backends.patched import LigerPatchedBackend
    from fusedce_profiler.instrument.step.jobs import append_model_result
    from fusedce_reports.model_report import group_saving_table, write_model_report

    monkeypatch.syspath_prepend(str(FAKE_LIGER))
    for name in [m for m in sys.modules if m.startswith("liger_kernel")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(LigerPatchedBackend, "devices", ("cuda", "cpu"))
    source = HFSource(LLAMA, name="llama")
    torch_result = run_job(_job(source, "torch"))
    patched = run_job(_job(source, "liger-patched"))
    assert patched.status == "ok", patched.message
    groups = {r.group for r in patched.replaced}
    assert {"norms", "MLP", "LM-head/loss"} <= groups
    assert any(r.group == "norms" and r.count == 5 for r in patched.replaced)  # 2 layers × 2 + final norm
    for r in (torch_result, patched):
        append_model_result(tmp_path, r)
    table = group_saving_table([torch_result, patched])
    assert "saved in LM-head/loss" in table.columns and "saved in norms" in table.columns
    assert "LlamaRMSNorm" in table.iloc[0]["replaced"]
    assert "Where each back-end's saving comes from" in write_model_report(tmp_path).read_text()


def test_missing_transformers_is_a_one_line_error_exit_2(monkeypatch):
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    monkeypatch.setitem(sys.modules, "transformers", None)
    result = CliRunner().invoke(app, ["model", "--device", "cpu", "--hf", "tiny"])
    assert result.exit_code == 2
    assert 'pip install "fusedce[hf]"' in result.output
