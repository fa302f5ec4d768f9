"""Model sources behind one interface: what a training step is measured on.

A :class:`ModelSource` has a ``name``, a ``kind`` and a :class:`~fusedce_profiler.instrument.models.configs.ModelConfig`
(V, H, layers, heads, soft-cap: what the reports and the attribution need), and
:meth:`ModelSource.build` makes the ``nn.Module`` on a device and locates its LM head
(:mod:`fusedce_profiler.instrument.models.head`), returning a :class:`BuiltModel`. Three kinds:

- ``builtin``: the GPT of :mod:`fusedce_profiler.instrument.models.gpt` from a preset or config file (no extra
  dependency; the CPU/CI workhorse);
- ``hf``: a Hugging Face model built with ``AutoModelForCausalLM.from_config`` (random
  weights, nothing downloaded) from a ``config.json``, a folder holding one, or one of our
  presets translated to its Hugging Face family (``llama-3-8b`` → ``LlamaConfig`` …);
  ``attn_implementation`` is ``eager``, ``sdpa`` or what the installed transformers offers;
- ``user``: ``package.module:factory`` — a callable returning an ``nn.Module`` whose
  ``forward(input_ids)`` returns logits (a tensor, an object with ``.logits`` or a tuple
  whose first item is them); if the factory takes an argument it receives the parsed
  :class:`ModelConfig` (``--preset``/``--config``), else it is called without one.

A source crosses into a worker process as :meth:`ModelSource.to_dict` (plain JSON) and comes
back with :func:`source_from_dict`. Optional packages are imported only when a source of
their kind is built.

Public API: :class:`ModelSource`, :class:`BuiltinSource`, :class:`HFSource`,
:class:`UserSource`, :class:`BuiltModel`, :func:`source_from_dict`, :func:`hf_attention_impls`,
:class:`MissingDependency`.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from fusedce_profiler.instrument import confined
from fusedce_profiler.instrument.callables import load_callable, what_it_raised
from fusedce_profiler.instrument.models.configs import PRESETS, ModelConfig, config_from_dict, preset_hf_config
from fusedce_profiler.instrument.models.gpt import ATTENTION_IMPLS, GPT
from fusedce_profiler.instrument.models.head import Head, locate_head

#: Attention implementations a Hugging Face model may be built with (those the installed
#: transformers supports are checked when it is built).
HF_ATTENTION_IMPLS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")

class FactorySignatureError(ValueError):
    """A ``--model`` factory that cannot be called as ``factory()`` / ``factory(config)``, or that
    returned something other than an ``nn.Module``."""


class FactoryRaised(RuntimeError):
    """A user's ``--model`` factory raised when it was called: the message names the factory and what
    it raised (the exception itself is the ``__cause__``), never a back-end or an option of the tool."""


class MissingDependency(RuntimeError):
    """An optional package a source needs is not installed (the message says what to install)."""


def require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise MissingDependency('Hugging Face models need transformers: pip install "fusedce[hf]"') from None
    return transformers


def hf_attention_impls() -> tuple[str, ...]:
    """The ``attn_implementation`` values the installed transformers accepts (best effort)."""
    try:
        transformers = require_transformers()
    except MissingDependency:
        return ()
    impls = ["eager", "sdpa"]
    try:
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():
            impls.append("flash_attention_2")
    except ImportError:
        pass
    if hasattr(transformers, "integrations") and hasattr(torch.nn.attention, "flex_attention"):
        impls.append("flex_attention")
    return tuple(impls)


@dataclass
class BuiltModel:
    """A model ready to train: the module, its located head and how to call it.

    ``call(input_ids)`` runs the model's own forward and returns what it returned;
    ``logits_of(output)`` picks the (B, T, V) logits out of it. ``model_type`` is the Hugging
    Face family (``llama``, ``gpt2`` …) or ``None``; ``trunk`` is the module whose output the
    head reads (the decoder), when known.
    """

    module: nn.Module
    head: Head
    kind: str
    model_type: str | None = None
    trunk: nn.Module | None = None
    call: Callable[[torch.Tensor], Any] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.call is None:
            self.call = self.module

    @staticmethod
    def logits_of(output: Any) -> torch.Tensor:
        if isinstance(output, torch.Tensor):
            return output
        logits = getattr(output, "logits", None)
        if isinstance(logits, torch.Tensor):
            return logits
        if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
            return output[0]
        raise TypeError(f"the model's forward returned {type(output).__name__}: expected logits (a tensor, "
                        "an object with .logits, or a tuple whose first item is the logits)")


class ModelSource:
    """Where a model comes from. Subclasses set ``kind`` and implement :meth:`build`."""

    kind = ""

    def __init__(self, name: str, config: ModelConfig, head_path: str | None = None) -> None:
        self.name, self.config, self.head_path = name, config, head_path

    @property
    def attention_impls(self) -> tuple[str, ...]:
        return ATTENTION_IMPLS

    def build(self, device: str | torch.device, *, attention: str = "sdpa", checkpointing: bool = False,
              seed: int = 0) -> BuiltModel:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def parameters(self) -> int:
        """The model's parameter count (shared parameters once): the config's, for the built-in
        and Hugging Face models; a user's factory's module counts its own."""
        return self.config.num_parameters()

    def with_tie(self, tied: bool) -> "ModelSource":
        """The same source with ``tie_word_embeddings`` overridden (where the source allows it)."""
        raise ValueError(f"--tied/--untied cannot change a {self.kind} model: its factory decides the tie")

    def _locate(self, module: nn.Module) -> Head:
        return locate_head(module, vocab=self.config.vocab_size, head_path=self.head_path)


class BuiltinSource(ModelSource):
    """The built-in GPT of a :class:`ModelConfig`."""

    kind = "builtin"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.name, config)

    def build(self, device, *, attention="sdpa", checkpointing=False, seed=0) -> BuiltModel:
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS} for the built-in model, got {attention!r}")
        with torch.device(device):
            model = GPT(self.config, attention=attention, checkpointing=checkpointing, seed=seed)
        return BuiltModel(module=model, head=self._locate(model), kind=self.kind, trunk=model.final_norm)

    def with_tie(self, tied: bool) -> "BuiltinSource":
        return BuiltinSource(self.config.replace(tie_word_embeddings=tied))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "config": self.config.to_dict()}


class HFSource(ModelSource):
    """A Hugging Face ``AutoModelForCausalLM`` from a config (dict of ``config.json`` fields)."""

    kind = "hf"

    def __init__(self, hf_config: dict, name: str | None = None, head_path: str | None = None) -> None:
        self.hf_config = dict(hf_config)
        config = config_from_dict(dict(self.hf_config), source="hf config",
                                  default_name=name or str(self.hf_config.get("model_type", "hf")))
        if name:
            config = config.replace(name=name)
        super().__init__(config.name, config, head_path)

    @classmethod
    def from_reference(cls, ref: str, head_path: str | None = None) -> "HFSource":
        """``ref``: a ``config.json``, a folder holding one, or one of our preset names."""
        path = Path(ref)
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"--hf {ref!r}: the folder has no config.json")
        elif path.exists() and not path.is_file():  # a FIFO or device: never opened, never taken for a preset name
            raise ValueError(f"--hf {ref!r}: not a regular file (a config.json or a folder holding one)")
        if path.is_file():
            try:
                raw = json.loads(confined.check_nesting(confined.user_text(path), path))
            except json.JSONDecodeError as exc:
                raise ValueError(f"--hf {ref!r}: not valid JSON: {exc}") from None
            except UnicodeDecodeError:
                raise ValueError(f"--hf {ref!r}: not UTF-8 text") from None
            except ValueError as exc:
                raise ValueError(f"--hf {ref!r}: {exc}") from None
            if not isinstance(raw, dict) or "model_type" not in raw:
                raise ValueError(f"--hf {ref!r}: a Hugging Face config.json needs a model_type field")
            name = path.parent.name if path.name == "config.json" else path.stem
            return cls(raw, name=name, head_path=head_path)
        if ref in PRESETS:
            return cls(preset_hf_config(ref), name=ref, head_path=head_path)
        raise ValueError(f"--hf {ref!r} is neither a config.json, a folder holding one, nor a preset "
                         f"({', '.join(PRESETS)})")

    @property
    def model_type(self) -> str:
        return str(self.hf_config["model_type"])

    @property
    def attention_impls(self) -> tuple[str, ...]:
        return HF_ATTENTION_IMPLS

    def describe(self) -> str:
        return f"hf:{self.name} ({self.model_type})"

    def with_tie(self, tied: bool) -> "HFSource":
        return HFSource({**self.hf_config, "tie_word_embeddings": tied}, name=self.name, head_path=self.head_path)

    def build(self, device, *, attention="sdpa", checkpointing=False, seed=0) -> BuiltModel:
        transformers = require_transformers()
        if attention not in HF_ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {', '.join(HF_ATTENTION_IMPLS)}, got {attention!r}")
        raw = {k: v for k, v in self.hf_config.items() if k not in ("architectures", "_name_or_path",
                                                                     "transformers_version", "torch_dtype", "dtype")}
        model_type = raw.pop("model_type")
        hf_config = transformers.AutoConfig.for_model(model_type, **raw)
        torch.manual_seed(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=attention)
        model.train()
        if checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x (the old name is deprecated)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        trunk = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "base_model", None)

        def call(input_ids):
            return model(input_ids=input_ids, use_cache=False)

        return BuiltModel(module=model, head=self._locate(model), kind=self.kind, model_type=model_type,
                          trunk=trunk if trunk is not model else None, call=call)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "hf_config": self.hf_config, "name": self.name, "head": self.head_path}


class UserSource(ModelSource):
    """``package.module:factory`` returning an ``nn.Module`` (see the module docstring)."""

    kind = "user"

    def __init__(self, target: str, config: ModelConfig | None = None, head_path: str | None = None,
                 inferred: ModelConfig | None = None, parameters: int | None = None) -> None:
        """``inferred`` / ``parameters``: the shapes and parameter count found before (by
        :func:`fusedce_profiler.instrument.models.factory.describe_factory`); without them the
        factory is called here to find them."""
        self.check_target(target)
        self.target, self.given = target, config
        super().__init__(target, inferred or config or _placeholder(target), head_path)
        self._parameters = parameters
        if inferred is None:
            self.config = self._infer_config()

    @staticmethod
    def check_target(target: str) -> None:
        """``ValueError`` unless ``target`` reads ``package.module:factory``."""
        module, sep, attr = target.partition(":")
        if not sep or not all(part.isidentifier() for part in f"{module}.{attr}".split(".")):
            raise ValueError(f"--model {target!r}: write 'package.module:factory'")

    @property
    def parameters(self) -> int:
        return self._parameters if self._parameters is not None else self.config.num_parameters()

    def _factory(self) -> Callable:
        return load_callable(self.target, "--model")

    def _make(self) -> nn.Module:
        factory = self._factory()
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # a builtin without one: call it as documented
            signature = None
        takes_config = signature is not None and any(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in signature.parameters.values())
        arguments = (self.given,) if takes_config and self.given is not None else ()
        if signature is not None:
            try:
                signature.bind(*arguments)
            except TypeError as exc:
                raise FactorySignatureError(
                    f"--model {self.target}: cannot be called as factory() or factory(config) ({exc})") from None
        try:
            module = factory(*arguments)
        except BaseException as exc:  # runs in a worker: any end of the factory is the factory's (the cause)
            what = what_it_raised(exc)
            raise FactoryRaised(f"--model {self.target}: the factory "
                                f"{what if isinstance(exc, SystemExit) else 'raised ' + what}") from exc
        if not isinstance(module, nn.Module):
            raise FactorySignatureError(f"--model {self.target} returned {type(module).__name__}, not an nn.Module")
        return module

    def _infer_config(self) -> ModelConfig:
        """V and H from the located head (built on the meta device when the factory allows it);
        layers and heads from the given config, else counted from the module tree.

        A factory that fails on the meta device with an exception (one that needs real tensors:
        ``.item()``, a loaded checkpoint) is called a second time, on the CPU; one that ends itself
        there (``sys.exit``, ``KeyboardInterrupt``) or cannot be called as documented is not."""
        try:
            with torch.device("meta"):
                module = self._make()
        except FactoryRaised as failed:
            if not isinstance(failed.__cause__, Exception):  # its own end (sys.exit): never a reason to retry
                raise
            module = self._make()
        head = locate_head(module, vocab=self.given.vocab_size if self.given else None, head_path=self.head_path)
        self._parameters = sum(p.numel() for p in module.parameters())  # parameters() yields a shared one once
        if self.given is not None:
            return self.given.replace(name=self.target, tie_word_embeddings=head.info.tied, source=self.target)
        attention = [m for m in module.modules() if _is_attention(m)]
        heads = next((getattr(m, a) for m in attention for a in ("num_heads", "n_head", "num_attention_heads",
                                                                  "heads", "n_heads")
                      if isinstance(getattr(m, a, None), int)), 1)
        h = head.info.hidden
        return ModelConfig(name=self.target, hidden_size=h, vocab_size=head.info.vocab,
                           num_hidden_layers=max(1, len(attention)),
                           num_attention_heads=heads if h % heads == 0 else 1, intermediate_size=4 * h,
                           tie_word_embeddings=head.info.tied, max_position_embeddings=1 << 20,
                           source=self.target)

    def build(self, device, *, attention="sdpa", checkpointing=False, seed=0) -> BuiltModel:
        torch.manual_seed(seed)
        with torch.device(device):
            model = self._make()
        model.train()
        if checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if not callable(enable):
                raise ValueError(f"--checkpointing: {self.target} has no gradient_checkpointing_enable()")
            enable()
        head = self._locate(model)
        return BuiltModel(module=model, head=head, kind=self.kind)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "target": self.target, "head": self.head_path,
                "given": self.given.to_dict() if self.given else None, "config": self.config.to_dict(),
                "parameters": self._parameters}


def _placeholder(name: str) -> ModelConfig:
    return ModelConfig(name=name, hidden_size=1, vocab_size=1, num_hidden_layers=1, num_attention_heads=1,
                       intermediate_size=1, source=name)


def _is_attention(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return "attention" in name or name.endswith("attn") or "selfattn" in name


def source_from_dict(raw: dict) -> ModelSource:
    """The source a :meth:`ModelSource.to_dict` described."""
    kind = raw.get("kind")
    if kind == "builtin":
        return BuiltinSource(ModelConfig(**raw["config"]))
    if kind == "hf":
        return HFSource(raw["hf_config"], name=raw.get("name"), head_path=raw.get("head"))
    if kind == "user":
        given = ModelConfig(**raw["given"]) if raw.get("given") else None
        return UserSource(raw["target"], given, raw.get("head"), inferred=ModelConfig(**raw["config"]),
                          parameters=raw.get("parameters"))
    raise ValueError(f"unknown model source kind {kind!r}")
