"""``--config`` / ``--preset``: the LM head a grid uses, from real and own-format configs."""
from pathlib import Path

import pytest

from fusedce_profile.heads import head_from

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def test_hugging_face_llama3_config_gives_its_head():
    head = head_from(None, CONFIGS / "llama-3-8b.config.json")
    assert (head.hidden, head.vocab, head.softcap) == (4096, 128256, None)


def test_hugging_face_gemma2_config_brings_its_logit_softcap():
    head = head_from(None, CONFIGS / "gemma-2-2b.config.json")
    assert (head.hidden, head.vocab, head.softcap) == (2304, 256000, 30.0)


def test_users_own_toml_format_gives_the_users_head():
    head = head_from(None, CONFIGS / "user-gpt.toml")
    assert (head.hidden, head.vocab, head.softcap) == (768, 32777, None)


def test_preset_and_own_format_config_agree_on_the_users_model():
    preset = head_from("user-gpt", None)
    config = head_from(None, CONFIGS / "user-gpt.toml")
    assert (preset.hidden, preset.vocab, preset.softcap) == (config.hidden, config.vocab, config.softcap)


def test_no_model_given_means_no_head():
    assert head_from(None, None) is None


@pytest.mark.parametrize("preset, config, message", [
    ("gpt2", CONFIGS / "user-gpt.toml", "give one of them"),
    ("no-such-model", None, "unknown preset 'no-such-model'"),
    (None, CONFIGS / "missing.json", "does not exist"),
])
def test_bad_model_choice_raises_value_error(preset, config, message):
    with pytest.raises(ValueError, match=message):
        head_from(preset, config)
