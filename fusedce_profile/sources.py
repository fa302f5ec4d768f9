"""The model a command measures and the loss back-ends it compares, from the public arguments.

A built-in preset or config, a Hugging Face model (``hf``) or the user's factory (``model``:
``package.module:factory``); the back-ends to compare (``backend``, torch first). Bad input raises
:class:`~fusedce_profile.errors.UsageError` naming the argument as the command line spells it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError
from fusedce_profiler.instrument.models import options
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.models.options import default_preset  # noqa: F401 - the commands' default model


def model_config(preset: str | None, config: str | Path | None, tied: bool | None, default: str) -> ModelConfig:
    """The built-in model of ``preset`` or ``config`` (``default`` when neither is given), its
    tie_word_embeddings overridden by ``tied``
    (:func:`~fusedce_profiler.instrument.models.options.model_config`, bad input as a UsageError)."""
    arguments.model_options(preset, config)
    try:
        return options.model_config(preset, Path(config) if config else None, tied, default)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def model_source(preset: str | None, config: str | Path | None, hf: str | None, user_model: str | None,
                 head: str | None, tied: bool | None, default: str, *, factory_timeout: float | None = None,
                 memory_bytes: int | None = None, log_dir: Path | None = None):
    """The model source of the arguments: ``hf``, ``user_model`` (with an optional preset/config
    passed to the factory), else the built-in GPT of ``preset`` / ``config``.

    A ``user_model`` factory is called once here, in a worker under ``factory_timeout`` seconds
    (default :data:`~fusedce_profiler.instrument.models.factory.FACTORY_TIMEOUT_S`) and a memory
    guard (``memory_bytes``; default half the machine's memory), its log in ``log_dir``, for its
    shapes and real parameter count: a factory that fails raises
    :class:`~fusedce_profiler.instrument.models.factory.FactoryFailed` (one line naming it), one
    that cannot be called as documented :class:`~fusedce_profile.errors.UsageError`."""
    arguments.model_options(preset, config, hf, user_model, head)
    if not user_model:  # a built-in or Hugging Face model: nothing of the user's runs to build it
        try:
            return options.source_from_options(preset, config, hf, None, head, tied, default)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from fusedce_profiler.instrument.models.factory import FACTORY_TIMEOUT_S, FactoryFailed, describe_factory
    from fusedce_profiler.instrument.models.source import UserSource

    try:
        options.check_model_choice(preset, config, hf, user_model, head)
        given = model_config(preset, config, None, default) if (preset or config) else None
        UserSource.check_target(user_model)
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        shapes, parameters = describe_factory(user_model, given, head, timeout_s=factory_timeout or FACTORY_TIMEOUT_S,
                                              memory_bytes=memory_bytes, log_dir=log_dir)
    except FactoryFailed as failed:
        if failed.bad_signature:
            raise UsageError(str(failed)) from None
        raise
    source = UserSource(user_model, given, head_path=head, inferred=shapes, parameters=parameters)
    return source if tied is None else source.with_tie(tied)


def backend_names(values: Sequence[str] | None, *, model: bool = True) -> list[str] | None:
    """The back-end names of ``values`` (each may hold several, comma-separated), duplicates
    removed; each a built-in back-end (with ``model``, also a model-mode one such as
    ``liger-patched``) or ``package.module:callable``. ``None`` when none is given."""
    from fusedce_profiler.instrument.backends import BUILTIN_BACKENDS, MODEL_BACKENDS

    values = arguments.names(values, "--backend")
    if not values:
        return None
    available = list(BUILTIN_BACKENDS) + [b for b in MODEL_BACKENDS if model and b not in BUILTIN_BACKENDS]
    names = [b.strip() for value in values for b in value.split(",")]
    if not all(names):  # "" or "a,,b": never read as "no --backend" (which runs the default set)
        raise UsageError(f"--backend: an empty back-end name in {', '.join(repr(v) for v in values)}; "
                         f"available: {', '.join(available)} (or 'package.module:callable')")
    for name in names:
        if name not in available and ":" not in name:
            raise UsageError(f"--backend: unknown back-end {name!r}; available: {', '.join(available)} "
                             "(or 'package.module:callable')")
    return list(dict.fromkeys(names))


def loss_backends(backend: Sequence[str] | None, default: Sequence[str]) -> list[str]:
    """The back-end names (``default`` when none is given), torch first: the reference."""
    names = backend_names(backend) or list(default)
    return ["torch"] + [b for b in names if b != "torch"]
