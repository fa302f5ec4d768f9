"""The model-source options shared by ``model``, ``parity``, ``doctor`` and ``explain``, and
their resolution: a built-in preset or config, a Hugging Face model (``--hf``) or the user's
factory (``--model``); the loss back-ends to compare (``--backend``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli.parsing import parse_backends
from fusedce_cli.usage import fail, usage_errors
from fusedce_profiler.instrument.models.configs import ModelConfig, get_preset, load_config

PresetOption = Annotated[Optional[str], typer.Option(
    "--preset", help="A built-in model (see `presets`); default user-gpt on a GPU, tiny on the CPU.")]
ConfigOption = Annotated[Optional[Path], typer.Option(
    "--config", help="A Hugging Face config.json, or our JSON/TOML (hidden_size, ffn_factor, ...).")]
TiedOption = Annotated[Optional[bool], typer.Option(
    "--tied/--untied", help="Override the config's tie_word_embeddings.")]
ModeOption = Annotated[Optional[str], typer.Option(
    "--mode", help="amp-bf16 (fp32 master weights, bf16 autocast), bf16 (pure bf16 parameters; model only) or "
                   "fp32. Default amp-bf16 (parity on CPU: fp32).")]
SeedOption = Annotated[int, typer.Option(
    help="Seed of the model's initialisation and of the data (a second seed repeats a comparison on "
         "another trajectory).", min=0)]
HFOption = Annotated[Optional[str], typer.Option(
    "--hf", help="A Hugging Face model built with AutoModelForCausalLM.from_config (random weights, no download): "
                 "a config.json, a folder holding one, or a preset name (needs pip install \"fusedce[hf]\").")]
UserModelOption = Annotated[Optional[str], typer.Option(
    "--model", help="Your own model: 'package.module:factory' returning an nn.Module whose forward(input_ids) "
                    "returns logits (the factory may take the --preset/--config ModelConfig).")]
HeadOption = Annotated[Optional[str], typer.Option(
    "--head", help="Attribute path of the LM head module (default: get_output_embeddings(), else the last "
                   "nn.Linear with out_features = vocabulary).")]
BackendOption = Annotated[Optional[list[str]], typer.Option(
    "--backend", metavar="NAME", help="Loss back-end (repeatable): torch, torch-compile, torch-native, fusedce, "
                      "fusedce-min, fusedce-fast, liger, cce, or module:callable with the back-end signature "
                      "(hidden, weight, target, bias, **options).")]


def default_preset(device: str) -> str:
    """The built-in model that ``model``, ``doctor`` and ``explain`` use when none is named:
    the seed's ``user-gpt`` on a GPU, ``tiny`` on the CPU."""
    return "user-gpt" if device.startswith("cuda") else "tiny"


def model_config(preset: Optional[str], config: Optional[Path], tied: Optional[bool], default: str) -> ModelConfig:
    """The built-in model of --preset or --config (``default`` when neither is given), its
    tie_word_embeddings overridden by --tied/--untied."""
    if preset and config:
        raise fail("--preset and --config both name a model: give one of them")
    with usage_errors():
        model = load_config(config) if config else get_preset(preset or default)
    return model if tied is None else dataclasses.replace(model, tie_word_embeddings=tied)


def model_source(preset: Optional[str], config: Optional[Path], hf: Optional[str], user_model: Optional[str],
                 head: Optional[str], tied: Optional[bool], default: str):
    """The model source of the options: --hf, --model (with an optional --preset/--config
    passed to the factory), else the built-in GPT of --preset/--config."""
    from fusedce_profiler.instrument.models.source import BuiltinSource, HFSource, MissingDependency, UserSource

    if hf and user_model:
        raise fail("--hf and --model both name a model: give one of them")
    if hf and (preset or config):
        raise fail("--hf names the model; --preset/--config are for the built-in model or a --model factory")
    try:
        if hf:
            from fusedce_profiler.instrument.models.source import require_transformers

            require_transformers()
            with usage_errors():
                source = HFSource.from_reference(hf, head_path=head)
        elif user_model:
            given = model_config(preset, config, None, default) if (preset or config) else None
            with usage_errors():
                source = UserSource(user_model, given, head_path=head)
        else:
            if head:
                raise fail("--head applies to --hf and --model sources (the built-in model's head is lm_head)")
            source = BuiltinSource(model_config(preset, config, None, default))
    except MissingDependency as exc:
        raise fail(str(exc)) from None
    if tied is not None:
        with usage_errors():
            source = source.with_tie(tied)
    return source


def loss_backends(backend: Optional[list[str]], default: list[str]) -> list[str]:
    """The --backend names (``default`` when none is given), torch first."""
    from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, MODEL_BACKENDS

    names = parse_backends(backend, list(BUILTIN_BACKENDS) + list(MODEL_BACKENDS)) or default
    return ["torch"] + [b for b in names if b != "torch"]  # torch first: the reference
