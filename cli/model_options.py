"""The model-source options shared by ``model``, ``parity``, ``doctor`` and ``explain``, and
their resolution: a built-in preset or config, a Hugging Face model (``--hf``) or the user's
factory (``--model``); the loss back-ends to compare (``--backend``)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli.parsing import parse_backends
from fusedce_cli.usage import fail, usage_errors
from fusedce_profiler.instrument.models import options
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.models.options import default_preset  # noqa: F401 - re-exported for the commands

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


def model_config(preset: Optional[str], config: Optional[Path], tied: Optional[bool], default: str) -> ModelConfig:
    """The built-in model of --preset or --config (``default`` when neither is given), its
    tie_word_embeddings overridden by --tied/--untied."""
    with usage_errors():
        return options.model_config(preset, config, tied, default)


def model_source(preset: Optional[str], config: Optional[Path], hf: Optional[str], user_model: Optional[str],
                 head: Optional[str], tied: Optional[bool], default: str):
    """The model source of the options (:func:`fusedce_profiler.instrument.models.options.source_from_options`);
    a bad combination exits 2 in one line."""
    with usage_errors():
        return options.source_from_options(preset, config, hf, user_model, head, tied, default)


def loss_backends(backend: Optional[list[str]], default: list[str]) -> list[str]:
    """The --backend names (``default`` when none is given), torch first."""
    from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, MODEL_BACKENDS

    names = parse_backends(backend, list(BUILTIN_BACKENDS) + list(MODEL_BACKENDS)) or default
    return ["torch"] + [b for b in names if b != "torch"]  # torch first: the reference
