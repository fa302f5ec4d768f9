"""The model a command names: a built-in preset or config, a Hugging Face model, or the user's factory.

:func:`source_from_options` turns the values of ``--preset``, ``--config``, ``--hf``, ``--model``,
``--head`` and ``--tied/--untied`` into a :class:`~fusedce_profiler.instrument.models.source.ModelSource`;
bad combinations raise ``ValueError`` in one line naming the options. :func:`check_model_options`
makes the same checks without building anything — a ``--model`` factory is user code, and
:class:`~fusedce_profiler.instrument.models.source.UserSource` calls it (to infer its config),
so a process that must not run user code checks with it and leaves the building to a worker.

Public API: :func:`default_preset`, :func:`model_config`, :func:`check_model_choice`, :func:`check_model_options`,
:func:`source_from_options`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from fusedce_profiler.instrument.models.configs import ModelConfig, get_preset, load_config


def default_preset(device: str) -> str:
    """The built-in model that ``model``, ``doctor`` and ``explain`` use when none is named:
    the seed's ``user-gpt`` on a GPU, ``tiny`` on the CPU."""
    return "user-gpt" if str(device).startswith("cuda") else "tiny"


def model_config(preset: str | None, config: str | Path | None, tied: bool | None, default: str) -> ModelConfig:
    """The built-in model of ``preset`` or ``config`` (``default`` when neither is given), its
    ``tie_word_embeddings`` overridden by ``tied``."""
    if preset and config:
        raise ValueError("--preset and --config both name a model: give one of them")
    model = load_config(config) if config else get_preset(preset or default)
    return model if tied is None else dataclasses.replace(model, tie_word_embeddings=tied)


def check_model_choice(preset: str | None, config: str | Path | None, hf: str | None, user_model: str | None,
                       head: str | None) -> None:
    """``ValueError`` for options that name two models, or a head the built-in model does not take."""
    if hf and user_model:
        raise ValueError("--hf and --model both name a model: give one of them")
    if hf and (preset or config):
        raise ValueError("--hf names the model; --preset/--config are for the built-in model or a --model factory")
    if head and not (hf or user_model):
        raise ValueError("--head applies to --hf and --model sources (the built-in model's head is lm_head)")


def check_model_options(preset: str | None, config: str | Path | None, hf: str | None, user_model: str | None,
                        head: str | None) -> None:
    """``ValueError`` for a combination of options that names no model or two of them."""
    check_model_choice(preset, config, hf, user_model, head)
    if preset and config:
        raise ValueError("--preset and --config both name a model: give one of them")
    if user_model and ":" not in user_model:
        raise ValueError(f"--model must be 'package.module:factory', got {user_model!r}")


def source_from_options(preset: str | None, config: str | Path | None, hf: str | None, user_model: str | None,
                        head: str | None, tied: bool | None, default: str):
    """The model source of the options: ``hf``, ``user_model`` (with an optional preset/config
    passed to the factory), else the built-in GPT of ``preset``/``config``. A missing optional
    package is a ``ValueError`` saying what to install."""
    from fusedce_profiler.instrument.models.source import (BuiltinSource, HFSource, MissingDependency, UserSource,
                                                           require_transformers)

    check_model_options(preset, config, hf, user_model, head)
    try:
        if hf:
            require_transformers()
            source = HFSource.from_reference(hf, head_path=head)
        elif user_model:
            given = model_config(preset, config, None, default) if (preset or config) else None
            source = UserSource(user_model, given, head_path=head)
        else:
            source = BuiltinSource(model_config(preset, config, None, default))
    except MissingDependency as exc:
        raise ValueError(str(exc)) from None
    return source if tied is None else source.with_tie(tied)
