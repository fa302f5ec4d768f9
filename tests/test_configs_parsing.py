"""fusedce_profiler.instrument.models.configs: Hugging Face config.json, our JSON/TOML, presets, and clear errors."""
import json

import pytest

from fusedce_profiler.instrument.models.configs import PRESETS, ModelConfig, config_from_dict, get_preset, load_config

LLAMA_3_8B_CONFIG = {  # the published config.json of meta-llama/Meta-Llama-3-8B (abridged)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "max_position_embeddings": 8192, "hidden_act": "silu",
}
GPT2_CONFIG = {  # openai-community/gpt2's config.json (abridged): GPT-2's own key names
    "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "n_positions": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new",
}


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hf_llama_config_matches_the_preset(tmp_path):
    config = load_config(_write(tmp_path, "config.json", json.dumps(LLAMA_3_8B_CONFIG)))
    preset = get_preset("llama-3-8b")
    for field in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "num_key_value_heads", "tie_word_embeddings", "norm", "mlp", "position"):
        assert getattr(config, field) == getattr(preset, field), field
    assert config.num_parameters() == 8_030_261_248  # the published parameter count


def test_hf_gpt2_spellings_and_defaults(tmp_path):
    config = load_config(_write(tmp_path, "config.json", json.dumps(GPT2_CONFIG)))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (768, 12, 12)
    assert config.intermediate_size == 4 * 768  # n_inner null means 4 × n_embd
    assert config.tie_word_embeddings is True  # absent in an HF config means tied
    assert (config.norm, config.mlp, config.position, config.max_position_embeddings) == (
        "layernorm", "gelu", "learned", 1024)


def test_hf_softcap_is_read():
    raw = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
           "num_hidden_layers": 26, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
           "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6}
    config = config_from_dict(raw)
    assert config.final_logit_softcapping == 30.0 and config.head_dim == 256 and config.norm == "rmsnorm"


def test_own_json_with_ffn_factor_is_the_users_model(tmp_path):
    text = json.dumps({"hidden_size": 768, "ffn_factor": 3.0, "num_hidden_layers": 12, "num_attention_heads": 12,
                       "vocab_size": 32777, "tie_word_embeddings": False})
    config = load_config(_write(tmp_path, "mine.json", text))
    user = get_preset("user-gpt")
    assert config.intermediate_size == 2304 and config.ffn_factor == 3.0
    assert config.num_parameters() == user.num_parameters()
    assert config.name == "mine"


def test_own_toml_top_level_and_model_table(tmp_path):
    body = ('hidden_size = 64\nffn_factor = 3.0\nnum_hidden_layers = 2\nnum_attention_heads = 4\n'
            'vocab_size = 100\ntie_word_embeddings = true\nnorm = "rmsnorm"\n')
    flat = load_config(_write(tmp_path, "a.toml", body))
    nested = load_config(_write(tmp_path, "b.toml", "[model]\n" + body))
    assert flat.replace(name="x", source="") == nested.replace(name="x", source="")
    assert flat.tie_word_embeddings is True and flat.norm == "rmsnorm" and flat.intermediate_size == 192


def test_own_format_defaults_to_untied():
    config = config_from_dict({"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "vocab_size": 10})
    assert config.tie_word_embeddings is False


@pytest.mark.parametrize("raw, message", [
    ({"hidden_size": 8, "ffn_factor": 2, "num_attention_heads": 2, "vocab_size": 10}, "num_hidden_layers"),
    ({"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}, "intermediate_size or ffn_factor"),
    ({"hidden_size": 8, "ffn_factor": 2, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
      "hiden_size": 9}, "unknown field.*hiden_size"),
    ({"hidden_size": -8, "ffn_factor": 2, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}, "hidden_size"),
    ({"hidden_size": 8, "ffn_factor": 2, "intermediate_size": 20, "num_hidden_layers": 1,
      "num_attention_heads": 2, "vocab_size": 10}, "disagrees"),
    ({"hidden_size": 10, "ffn_factor": 0.33, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10},
     "not an integer width"),
    ({"hidden_size": 10, "ffn_factor": 2, "num_hidden_layers": 1, "num_attention_heads": 3, "vocab_size": 10},
     "not divisible"),
    ({"hidden_size": 8, "ffn_factor": 2, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
      "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"hidden_size": 8, "ffn_factor": 2, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
      "norm": "batchnorm"}, "norm"),
])
def test_bad_fields_raise_value_error_naming_the_field(raw, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(raw, source="cfg.json")


def test_bad_files_raise_value_error_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="broken.json.*not valid JSON"):
        load_config(_write(tmp_path, "broken.json", "{"))
    with pytest.raises(ValueError, match="broken.toml.*not valid TOML"):
        load_config(_write(tmp_path, "broken.toml", "hidden_size = "))
    with pytest.raises(ValueError, match="list.json.*expected a JSON/TOML object"):
        load_config(_write(tmp_path, "list.json", "[1, 2]"))


def test_presets_carry_the_published_shapes():
    # Parameter counts without the linear biases our decoder omits: these match the
    # published totals exactly for Llama-3-8B and Mistral-NeMo (which have no biases).
    assert PRESETS["llama-3-8b"].num_parameters() == 8_030_261_248
    assert PRESETS["mistral-nemo"].num_parameters() == 12_247_782_400
    user = PRESETS["user-gpt"]
    assert (user.hidden_size, user.num_hidden_layers, user.num_attention_heads, user.vocab_size,
            user.ffn_factor, user.tie_word_embeddings) == (768, 12, 12, 32777, 3.0, False)
    assert PRESETS["gemma-2-2b"].final_logit_softcapping == 30.0
    assert PRESETS["gpt2"].tie_word_embeddings and PRESETS["gemma-2-2b"].tie_word_embeddings


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'.*user-gpt"):
        get_preset("gpt5")


def test_model_config_validates_directly():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelConfig("m", 64, 10, 1, 4, 128, num_key_value_heads=3)


def test_architecture_families_are_listed_once():
    from fusedce_profiler.instrument.models.configs import _GATED_FAMILIES, _LAYERNORM_FAMILIES

    assert not _GATED_FAMILIES & _LAYERNORM_FAMILIES


def test_hf_starcoder2_is_layernorm_with_a_plain_mlp_and_rope():
    cfg = config_from_dict({"model_type": "starcoder2", "hidden_size": 3072, "vocab_size": 49152,
                            "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
                            "intermediate_size": 12288, "hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5,
                            "rope_theta": 999999.4420358813})
    assert (cfg.norm, cfg.mlp, cfg.position) == ("layernorm", "gelu", "rope")


def test_a_model_folder_is_read_through_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 100,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                                      "intermediate_size": 128}))
    config = load_config(tmp_path)
    assert config.name == "llama"  # its model_type
    assert config.source == "config.json"  # stored in records and jobs: the file's name, never the machine's path


def test_a_name_that_is_not_a_string_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "listname.json"
    path.write_text(json.dumps({"name": ["a", "b"], "hidden_size": 32, "vocab_size": 256, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "intermediate_size": 64}))
    with pytest.raises(ValueError, match=r"listname\.json: name must be a string, got list"):
        load_config(path)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "model.toml"
    path.write_bytes(b"hidden_size = 64\nname = '\xff'\n")
    with pytest.raises(ValueError, match=r"model\.toml: not UTF-8 text"):
        load_config(path)


def test_deeply_nested_or_oversized_config_files_are_one_value_error(tmp_path):
    with pytest.raises(ValueError, match="deep.json: JSON nested deeper than the limit of 64 levels"):
        load_config(_write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000))
    with pytest.raises(ValueError, match="deep.toml: nested too deeply to read|deep.toml: not valid TOML"):
        load_config(_write(tmp_path, "deep.toml", "a = " + "[" * 100_000 + "]" * 100_000))
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate((16 << 20) + 1)  # sparse
    with pytest.raises(ValueError, match="big.json: 16777217 bytes, over the limit"):
        load_config(big)


def test_a_deeply_nested_hf_config_is_one_value_error_naming_the_reference(tmp_path):
    from fusedce_profiler.instrument.models.source import HFSource

    path = _write(tmp_path, "config.json", '{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match=r"--hf .*config.json.*nested deeper than the limit of 64 levels"):
        HFSource.from_reference(str(path))


@pytest.mark.parametrize("field, value", [
    ("ffn_factor", float("inf")), ("ffn_factor", float("nan")), ("norm_eps", float("-inf")), ("norm_eps", float("nan")),
    ("norm_eps", True), ("norm_eps", "x"), ("final_logit_softcapping", float("inf")), ("lm_head_bias", 5),
])
def test_a_config_number_that_is_not_finite_or_of_its_kind_is_refused_naming_the_field(field, value):
    """An infinite ffn_factor ended in an OverflowError traceback; a NaN or -inf norm_eps, an infinite
    soft-cap or a bias of 5 were run (a NaN loss stored, or every job failed)."""
    raw = {"hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_factor": 4,
           field: value}
    with pytest.raises(ValueError, match=field):
        config_from_dict(raw, source="c.json")


@pytest.mark.parametrize("hidden, factor", [(64, 1e308), (10**400, 4)])
def test_a_finite_ffn_factor_whose_width_overflows_is_refused_naming_it(hidden, factor):
    """``ffn_factor × hidden_size`` past a float's range (a finite factor of 1e308, or a 401-digit width)
    ended in an OverflowError traceback, exit 1."""
    raw = {"hidden_size": hidden, "vocab_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "ffn_factor": factor}
    with pytest.raises(ValueError, match=r"^c\.json: ffn_factor=.* past a float's range; give intermediate_size$"):
        config_from_dict(raw, source="c.json")
    with pytest.raises(ValueError, match=r"^c\.json: intermediate_size=256 disagrees with ffn_factor=.*give one of them$"):
        config_from_dict({**raw, "intermediate_size": 256}, source="c.json")


@pytest.mark.parametrize("family, key, value", [
    ("llama", "rms_norm_eps", [1]), ("gpt2", "layer_norm_epsilon", {"a": 1}), ("llama", "rms_norm_eps", "abc"),
    ("llama", "rms_norm_eps", float("nan")), ("gpt2", "layer_norm_epsilon", 0), ("llama", "rms_norm_eps", 10**400),
])
def test_a_hugging_face_norm_epsilon_of_the_wrong_kind_is_refused_naming_the_file_and_field(family, key, value):
    """A list or an object ended in a TypeError traceback; a string in a line naming neither file nor field."""
    raw = {"model_type": family, "hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128, key: value}
    with pytest.raises(ValueError, match=rf"^config\.json: {key} must be a positive finite number, got "):
        config_from_dict(raw, source="config.json")


@pytest.mark.parametrize("field", ["head_dim", "num_hidden_layers", "max_position_embeddings", "num_key_value_heads",
                                   "ffn_factor"])
def test_a_size_past_the_command_lines_limit_is_refused_naming_the_field(field):
    """A 331-digit ``head_dim`` or layer count ended in an OverflowError traceback; a 331-digit
    ``max_position_embeddings`` ran every step of ``explain``, then its own record was refused."""
    raw = {"hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, field: 10**330}
    with pytest.raises(ValueError, match=f"{field} must be a positive"):
        config_from_dict(raw, source="c.json")
    raw[field] = 2**63 if field != "ffn_factor" else 2.0
    if field != "ffn_factor":
        with pytest.raises(ValueError, match=f"{field} must be a positive integer up to 2⁶³ − 1, got 9223372036854775808"):
            config_from_dict(raw, source="c.json")
