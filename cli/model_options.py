"""The model-source options shared by ``model``, ``parity``, ``doctor`` and ``explain``, and
their resolution (:mod:`fusedce_profile.sources`): a built-in preset or config, a Hugging Face model (``--hf``) or the user's
factory (``--model``); the loss back-ends to compare (``--backend``)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli import exit_codes
from fusedce_cli.console import error
from fusedce_cli.parsing import parse_mode
from fusedce_cli.usage import usage_errors
from fusedce_profile import sources
from fusedce_profile.sources import default_preset  # noqa: F401 - the commands take it from here
from fusedce_profiler.instrument.models.configs import ModelConfig

PresetOption = Annotated[Optional[str], typer.Option(
    "--preset", help="A built-in model (see `presets`); default user-gpt on a GPU, tiny on the CPU.")]
ConfigOption = Annotated[Optional[Path], typer.Option(
    "--config", help="A Hugging Face config.json, or our JSON/TOML (hidden_size, ffn_factor, ...).")]
TiedOption = Annotated[Optional[bool], typer.Option(
    "--tied/--untied", help="Override the config's tie_word_embeddings.")]
def _mode_value(value: Optional[str]) -> Optional[str]:
    """The ``--mode`` callback: a Lightning precision name becomes the mode it stands for."""
    return parse_mode(value)


ModeOption = Annotated[Optional[str], typer.Option(
    "--mode", callback=_mode_value,
    help="amp-bf16 (fp32 master weights, bf16 autocast), bf16 (pure bf16 parameters; model only) or "
         "fp32; Lightning's names bf16-mixed, bf16-true, 32-true are the same. Default amp-bf16 (parity on CPU: fp32).")]
SeedOption = Annotated[int, typer.Option(
    help="Seed of the model's initialisation and of the data (a second seed repeats a comparison on "
         "another trajectory).")]
HFOption = Annotated[Optional[str], typer.Option(
    "--hf", help="A Hugging Face model built with AutoModelForCausalLM.from_config (random weights, no download): "
                 "a config.json, a folder holding one, or a preset name (needs pip install \"fusedce[hf]\").")]
UserModelOption = Annotated[Optional[str], typer.Option(
    "--model", help="Your own model: 'package.module:factory' returning an nn.Module whose forward(input_ids) "
                    "returns logits (the factory may take the --preset/--config ModelConfig).")]
HeadOption = Annotated[Optional[str], typer.Option(
    "--head", help="Attribute path of the LM head module (default: get_output_embeddings(), else the last "
                   "nn.Linear with out_features = vocabulary).")]
FactoryTimeoutOption = Annotated[Optional[float], typer.Option(
    "--factory-timeout", metavar="SECONDS",
    help="Time limit of one call of the --model factory (default 300).")]
BackendOption = Annotated[Optional[list[str]], typer.Option(
    "--backend", metavar="NAME", help="Loss back-end (repeatable): torch, torch-compile, torch-native, fusedce, "
                      "fusedce-min, fusedce-fast, liger, cce, or module:callable with the back-end signature "
                      "(hidden, weight, target, bias, **options).")]


def model_config(preset: Optional[str], config: Optional[Path], tied: Optional[bool], default: str) -> ModelConfig:
    """The built-in model of --preset or --config (:func:`fusedce_profile.sources.model_config`); exit 2
    on a bad one."""
    with usage_errors():
        return sources.model_config(preset, config, tied, default)


@contextmanager
def factory_errors() -> Iterator[None]:
    """A ``--model`` factory or a back-end whose own code failed while it was checked
    (:class:`~fusedce_profiler.instrument.callables.CallableFailed`, of which
    :class:`~fusedce_profiler.instrument.models.factory.FactoryFailed` is one) becomes its one line
    and exit code 1."""
    from fusedce_profiler.instrument.callables import CallableFailed

    try:
        yield
    except CallableFailed as failed:
        error(str(failed))
        raise typer.Exit(exit_codes.CHECK_FAILED) from None


def model_source(preset: Optional[str], config: Optional[Path], hf: Optional[str], user_model: Optional[str],
                 head: Optional[str], tied: Optional[bool], default: str):
    """The model source of the options (:func:`fusedce_profile.sources.model_source`); exit 2 on bad ones,
    1 when a --model factory fails."""
    with usage_errors(), factory_errors():
        return sources.model_source(preset, config, hf, user_model, head, tied, default)


def loss_backends(backend: Optional[list[str]], default: list[str]) -> list[str]:
    """The --backend names (``default`` when none is given), torch first."""
    with usage_errors():
        return sources.loss_backends(backend, default)
