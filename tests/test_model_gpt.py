"""fusedce_profiler.instrument.models.gpt: the decoder built from a config, both config formats, every variant."""
import json

import pytest
import torch

from fusedce_profiler.instrument.models.configs import get_preset, load_config
from fusedce_profiler.instrument.models.gpt import GPT


def _ids(config, batch=2, seq=16):
    return torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fmt", ["hf", "own-json", "own-toml"])
def test_builds_from_each_config_format_with_the_predicted_parameter_count(tmp_path, fmt):
    if fmt == "hf":
        path = tmp_path / "config.json"
        path.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 80,
                                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                    "vocab_size": 97, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}))
    elif fmt == "own-json":
        path = tmp_path / "m.json"
        path.write_text(json.dumps({"hidden_size": 32, "ffn_factor": 3.0, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "vocab_size": 97, "tie_word_embeddings": True}))
    else:
        path = tmp_path / "m.toml"
        path.write_text("hidden_size = 32\nffn_factor = 2.5\nnum_hidden_layers = 2\nnum_attention_heads = 4\n"
                        "vocab_size = 97\n")
    config = load_config(path)
    model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()
    assert model.hidden_states(_ids(config)).shape == (2, 16, 32)
    assert model(_ids(config)).shape == (2, 16, 97)
    assert model.lm_head_weight.shape == (97, 32)


def test_tied_head_is_the_embedding_parameter():
    model = GPT(get_preset("tiny").replace(tie_word_embeddings=True))
    assert model.lm_head_weight is model.embed.weight
    untied = GPT(get_preset("tiny"))
    assert untied.lm_head_weight is not untied.embed.weight


def test_same_seed_same_weights_different_seed_different_weights():
    config = get_preset("tiny")
    a, b, c = GPT(config, seed=3), GPT(config, seed=3), GPT(config, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head_weight, c.lm_head_weight)


@pytest.mark.parametrize("variant", [{}, {"norm": "rmsnorm", "mlp": "gated", "position": "rope",
                                           "num_key_value_heads": 2}])
def test_eager_attention_matches_sdpa(variant):
    config = get_preset("tiny").replace(**variant)
    ids = _ids(config)
    sdpa, eager = GPT(config, attention="sdpa"), GPT(config, attention="eager")
    torch.testing.assert_close(eager(ids), sdpa(ids), rtol=1e-5, atol=1e-5)


def test_attention_is_causal():
    config = get_preset("tiny")
    model = GPT(config)
    ids = _ids(config)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % config.vocab_size
    torch.testing.assert_close(model(ids)[:, :-1], model(changed)[:, :-1])


def test_checkpointing_gives_the_same_gradients():
    config = get_preset("tiny")
    ids = _ids(config)
    grads = []
    for checkpointing in (False, True):
        model = GPT(config, checkpointing=checkpointing)
        model(ids).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1)


def test_forward_returns_soft_capped_logits_through_lm_head_of_the_final_norm_of_trunk():
    config = get_preset("tiny").replace(final_logit_softcapping=2.0)
    model = GPT(config)
    ids = _ids(config)
    hidden = model.final_norm(model.trunk(ids))
    torch.testing.assert_close(model.hidden_states(ids), hidden)
    torch.testing.assert_close(model(ids), model.logits(hidden))
    assert model(ids).abs().max() <= 2.0
    seen = []
    model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    model(ids)
    assert seen == [(2, 16, config.vocab_size)]  # the logits go through the head module, as in real models


def test_too_long_sequence_is_a_clear_error():
    config = get_preset("tiny")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        GPT(config)(torch.zeros(1, config.max_position_embeddings + 1, dtype=torch.long))


def test_unknown_attention_impl_is_rejected():
    with pytest.raises(ValueError, match="attention impl"):
        GPT(get_preset("tiny"), attention="flash")
