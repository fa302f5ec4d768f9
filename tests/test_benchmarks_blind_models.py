"""The GPT written for the blind benchmarks: its two attentions agree, it trains with
checkpointing, and it loads as a ``--model`` factory through fusedce's model source."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks import blind_models
from fusedce_profiler.instrument.models.configs import get_preset


def _config():
    return get_preset("tiny").replace(tie_word_embeddings=False)


def test_spelled_out_attention_and_sdpa_agree_in_float32():
    config = _config()
    torch.manual_seed(0)
    eager = blind_models.eager_gpt(config)
    sdpa = blind_models.sdpa_gpt(config)
    sdpa.load_state_dict(eager.state_dict())
    ids = torch.randint(0, config.vocab_size, (2, 16))
    torch.testing.assert_close(eager(ids), sdpa(ids), atol=1e-5, rtol=1e-5)


def test_a_checkpointed_step_gives_the_gradients_of_a_plain_one():
    config = _config()
    torch.manual_seed(0)
    plain, ckpt = blind_models.sdpa_gpt(config), blind_models.sdpa_gpt(config)
    ckpt.load_state_dict(plain.state_dict())
    ckpt.gradient_checkpointing_enable()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    for model in (plain, ckpt):
        logits = model(ids)
        F.cross_entropy(logits.reshape(-1, config.vocab_size), ids.reshape(-1)).backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_the_factories_load_as_a_user_model_source():
    from fusedce_profiler.instrument.models.source import UserSource, source_from_dict

    config = _config()
    source = source_from_dict(UserSource("benchmarks.blind_models:eager_gpt", config).to_dict())
    built = source.build("cpu")
    assert source.kind == "user" and source.config.vocab_size == config.vocab_size
    assert built.module.lm_head.weight.shape == (config.vocab_size, config.hidden_size)
