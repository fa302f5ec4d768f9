"""Model configurations: the shapes that decide an LM's training memory.

A :class:`ModelConfig` comes from one of three places:

- a Hugging Face ``config.json`` (``hidden_size``, ``vocab_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``intermediate_size``, ``tie_word_embeddings``,
  ``final_logit_softcapping``, ...; GPT-2's ``n_embd`` / ``n_layer`` / ``n_head`` /
  ``n_inner`` spellings too). Unknown keys are ignored; a missing ``tie_word_embeddings``
  means tied, as in ``transformers``;
- our own small JSON or TOML file with the same names, where ``ffn_factor`` (MLP width as
  a multiple of ``hidden_size``) may replace ``intermediate_size``. Unknown keys are an
  error (a typo must not silently fall back to a default); a missing
  ``tie_word_embeddings`` means untied;
- :data:`PRESETS`, with the published numbers of common models (no download needed).

Every problem is a ``ValueError`` naming the file and the field. :func:`preset_hf_config` writes a
preset back as a Hugging Face ``config.json`` (the ``--hf PRESET`` models).
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedce_profiler.instrument import confined

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "gated")  # gelu: up → GELU → down; gated: down(act(gate) · up), SwiGLU/GeGLU
POSITIONS = ("learned", "rope")

# Families whose MLP is gated (three matrices) and whose norm is RMSNorm, and families with a
# plain GELU MLP and LayerNorm. Disjoint (a test checks): StarCoder2 is LayerNorm with a plain
# c_fc → GELU → c_proj MLP (and RoPE, from its rope_theta), so it is in the second set only.
_GATED_FAMILIES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi3", "olmo", "olmo2", "granite", "cohere",
}
_LAYERNORM_FAMILIES = {"gpt2", "gpt_neo", "gpt_neox", "gptj", "opt", "bloom", "phi", "falcon", "starcoder2"}


_MAX_SIZE = 2**63 - 1  # the largest size a config may give (a tensor dimension's): a larger one is no model

def _finite_number(value: Any) -> bool:
    """An int or a float that is neither a bool, NaN, infinite nor past a float's range (a config's numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= sys.float_info.max


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer's shape.

    ``intermediate_size`` is the MLP width (for a gated MLP, the width of each of the gate
    and up projections). ``num_key_value_heads`` < ``num_attention_heads`` is grouped-query
    attention; ``head_dim`` defaults to ``hidden_size // num_attention_heads``.
    ``final_logit_softcapping`` is Gemma-2's ``softcap · tanh(logits / softcap)``.
    """

    name: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = False
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    final_logit_softcapping: float | None = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    mlp: str = "gelu"
    position: str = "learned"
    max_position_embeddings: int = 2048
    lm_head_bias: bool = False
    source: str = "preset"

    def __post_init__(self) -> None:
        where = f"model config {self.name!r} ({self.source})"
        sizes = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "head_dim", "num_key_value_heads")
        for key, value in ((key, getattr(self, key)) for key in sizes):  # the last two may be None
            if (value is not None or key in sizes[:-2]) and (
                    isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_SIZE):
                raise ValueError(f"{where}: {key} must be a positive integer up to 2⁶³ − 1, got {value!r:.40}")
        kv = self.num_key_value_heads
        if kv is not None and self.num_attention_heads % kv:
            raise ValueError(f"{where}: num_key_value_heads must be a positive divisor of "
                             f"num_attention_heads={self.num_attention_heads}, got {kv!r}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{where}: hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads} (give head_dim)")
        if self.norm not in NORMS:
            raise ValueError(f"{where}: norm must be one of {NORMS}, got {self.norm!r}")
        if self.mlp not in MLPS:
            raise ValueError(f"{where}: mlp must be one of {MLPS}, got {self.mlp!r}")
        if self.position not in POSITIONS:
            raise ValueError(f"{where}: position must be one of {POSITIONS}, got {self.position!r}")
        cap = self.final_logit_softcapping
        if cap is not None and not (_finite_number(cap) and cap > 0):
            raise ValueError(f"{where}: final_logit_softcapping must be a positive finite number or null, got {cap!r}")
        if not (_finite_number(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"{where}: norm_eps must be a positive finite number, got {self.norm_eps!r}")
        for flag in ("tie_word_embeddings", "lm_head_bias"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{where}: {flag} must be true or false, got {getattr(self, flag)!r}")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn_factor(self) -> float:
        """MLP width as a multiple of ``hidden_size``."""
        return self.intermediate_size / self.hidden_size

    def num_parameters(self) -> int:
        """Parameter count of the model :mod:`fusedce_profiler.instrument.models.gpt` builds (tied head counted once)."""
        h, v, d = self.hidden_size, self.vocab_size, self.attention_head_dim
        q_out, kv_out = self.num_attention_heads * d, self.kv_heads * d
        norm = h if self.norm == "rmsnorm" else 2 * h
        attn = h * (q_out + 2 * kv_out) + q_out * h
        mlp = (3 if self.mlp == "gated" else 2) * h * self.intermediate_size
        per_layer = attn + mlp + 2 * norm
        embed = v * h + (self.max_position_embeddings * h if self.position == "learned" else 0)
        head = 0 if self.tie_word_embeddings else v * h
        return embed + self.num_hidden_layers * per_layer + norm + head + (v if self.lm_head_bias else 0)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _user_gpt() -> ModelConfig:
    # The model behind the "only 600 MB saved" report: a plain GPT block, untied head.
    return ModelConfig(
        name="user-gpt", hidden_size=768, vocab_size=32777, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=round(3.0 * 768), tie_word_embeddings=False,
        norm="layernorm", mlp="gelu", position="learned", max_position_embeddings=2048,
    )


#: Published shapes (from each model's ``config.json``), keyed by preset name.
PRESETS: dict[str, ModelConfig] = {
    "gpt2": ModelConfig(
        name="gpt2", hidden_size=768, vocab_size=50257, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, tie_word_embeddings=True, norm="layernorm", norm_eps=1e-5,
        mlp="gelu", position="learned", max_position_embeddings=1024,
    ),
    "llama-3-8b": ModelConfig(
        name="llama-3-8b", hidden_size=4096, vocab_size=128256, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        tie_word_embeddings=False, norm="rmsnorm", norm_eps=1e-5, mlp="gated", position="rope",
        max_position_embeddings=8192,
    ),
    "gemma-2-2b": ModelConfig(
        name="gemma-2-2b", hidden_size=2304, vocab_size=256000, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=9216,
        tie_word_embeddings=True, final_logit_softcapping=30.0, norm="rmsnorm", norm_eps=1e-6,
        mlp="gated", position="rope", max_position_embeddings=8192,
    ),
    "qwen2.5-7b": ModelConfig(
        name="qwen2.5-7b", hidden_size=3584, vocab_size=152064, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
        tie_word_embeddings=False, norm="rmsnorm", norm_eps=1e-6, mlp="gated", position="rope",
        max_position_embeddings=131072,
    ),
    "mistral-nemo": ModelConfig(
        name="mistral-nemo", hidden_size=5120, vocab_size=131072, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
        tie_word_embeddings=False, norm="rmsnorm", norm_eps=1e-5, mlp="gated", position="rope",
        max_position_embeddings=1024000,
    ),
    "user-gpt": _user_gpt(),
    # A few-million-parameter model for CPU runs, parity and doctor checks.
    "tiny": ModelConfig(
        name="tiny", hidden_size=64, vocab_size=512, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=192, tie_word_embeddings=False, norm="layernorm", mlp="gelu",
        position="learned", max_position_embeddings=256,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


# --- parsing -------------------------------------------------------------------------------

# Hugging Face spellings → our field names (first match wins).
_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}
_OWN_KEYS = {f.name for f in dataclasses.fields(ModelConfig)} | {"ffn_factor"}


def load_config(path: str | Path) -> ModelConfig:
    """Read a model config from a ``.json`` (Hugging Face or ours) or ``.toml`` file, or from
    the ``config.json`` of a model folder (a Hugging Face checkpoint's layout).

    TOML needs Python ≥ 3.11 (``tomllib``). A TOML file may put the fields at the top level
    or in a ``[model]`` table.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"config folder {str(path)!r} has no config.json (give the file, or a model "
                             "folder that holds one)")
        path = path / "config.json"
    if not path.exists():  # what exists but is not a regular file is named by user_text
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        text = confined.user_text(path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}); a config is a JSON or TOML file") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise ValueError(f"{path}: reading TOML needs Python 3.11 or newer (tomllib); "
                             "use a .json config instead") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
        except RecursionError:
            raise ValueError(f"{path}: nested too deeply to read") from None
        except ValueError as exc:  # a value Python cannot convert (an integer of more than 4,300 digits)
            raise ValueError(f"{path}: {exc}") from None
        if set(raw) == {"model"} and isinstance(raw["model"], dict):
            raw = raw["model"]
    else:
        try:
            raw = json.loads(confined.check_nesting(text, path))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        except ValueError as exc:  # a value Python cannot convert (an integer of more than 4,300 digits)
            raise ValueError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON/TOML object of fields, got {type(raw).__name__}")
    config = config_from_dict(raw, source=str(path), default_name=path.parent.name if path.name == "config.json"
                              else path.stem)
    # its messages named the path as given; what is stored (records, a worker's job) names the file only:
    # a run folder holds no absolute path of the machine it ran on
    return dataclasses.replace(config, source=path.name)


def is_hf_config(raw: dict[str, Any]) -> bool:
    """Whether ``raw`` looks like a Hugging Face ``config.json`` rather than our format."""
    return "model_type" in raw or "architectures" in raw or "n_embd" in raw


def config_from_dict(raw: dict[str, Any], *, source: str = "<dict>", default_name: str = "model") -> ModelConfig:
    """Build a :class:`ModelConfig` from parsed fields (HF ``config.json`` or our format)."""
    hf = is_hf_config(raw)
    if not hf:
        unknown = sorted(set(raw) - _OWN_KEYS)
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {', '.join(unknown)}; "
                             f"known fields: {', '.join(sorted(_OWN_KEYS - {'source'}))}")

    def pick(field_name: str) -> Any:
        for key in _ALIASES.get(field_name, (field_name,)):
            if raw.get(key) is not None:
                return raw[key]
        return None

    def required_int(field_name: str) -> int:
        value = pick(field_name)
        if value is None:
            raise ValueError(f"{source}: missing required field {field_name!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{source}: {field_name} must be a positive integer, got {value!r}")
        return value

    hidden = required_int("hidden_size")
    name = raw.get("name") or raw.get("_name_or_path") or raw.get("model_type") or default_name
    if not isinstance(name, str):
        raise ValueError(f"{source}: name must be a string, got {type(name).__name__}")
    fields: dict[str, Any] = {
        "name": name,
        "hidden_size": hidden,
        "vocab_size": required_int("vocab_size"),
        "num_hidden_layers": required_int("num_hidden_layers"),
        "num_attention_heads": required_int("num_attention_heads"),
        "intermediate_size": _intermediate_size(raw, pick("intermediate_size"), hidden, hf, source),
        "tie_word_embeddings": raw.get("tie_word_embeddings", hf),
        "source": source,
    }
    for key in ("num_key_value_heads", "head_dim", "final_logit_softcapping", "norm_eps",
                "max_position_embeddings", "lm_head_bias"):
        value = pick(key)
        if value is not None:
            fields[key] = value
    if hf:
        fields.update(_hf_architecture(raw, source))
    else:
        for key in ("norm", "mlp", "position"):
            if key in raw:
                fields[key] = raw[key]
    try:
        return ModelConfig(**fields)
    except TypeError as exc:  # a wrongly typed value that dataclass construction rejects
        raise ValueError(f"{source}: {exc}") from None


def _intermediate_size(raw: dict[str, Any], explicit: Any, hidden: int, hf: bool, source: str) -> int:
    factor = raw.get("ffn_factor")
    if factor is not None and not (_finite_number(factor) and factor > 0):
        raise ValueError(f"{source}: ffn_factor must be a positive finite number, got {factor!r}")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit <= 0:
            raise ValueError(f"{source}: intermediate_size must be a positive integer, got {explicit!r}")
        width = None if factor is None else _ffn_width(factor, hidden)
        if width is not None and not (math.isfinite(width) and explicit == round(width)):
            raise ValueError(f"{source}: intermediate_size={explicit} disagrees with ffn_factor={factor} × "
                             f"hidden_size={hidden}; give one of them")
        return explicit
    if factor is not None:
        size = _ffn_width(factor, hidden)
        if not math.isfinite(size):
            raise ValueError(f"{source}: ffn_factor={factor} × hidden_size={hidden} is past a float's range; give "
                             "intermediate_size")
        if not math.isclose(size, round(size), abs_tol=1e-6):
            raise ValueError(f"{source}: ffn_factor={factor} × hidden_size={hidden} is not an integer width")
        return round(size)
    if (hf and raw.get("model_type") == "gpt2") or "n_embd" in raw:
        return 4 * hidden  # GPT-2's n_inner=null means 4 × n_embd
    raise ValueError(f"{source}: missing MLP width: give intermediate_size or ffn_factor")


def _ffn_width(factor: float, hidden: int) -> float:
    """``factor × hidden`` as a float; infinite where it is past a float's range."""
    try:
        return float(factor * hidden)
    except OverflowError:
        return math.inf


def _hf_architecture(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """Norm, MLP and position flavour of a Hugging Face config, from its family and keys."""
    family = str(raw.get("model_type", "gpt2" if "n_embd" in raw else "")).lower()
    act = str(raw.get("hidden_act") or raw.get("hidden_activation") or raw.get("activation_function") or "")
    gated = family in _GATED_FAMILIES or (family not in _LAYERNORM_FAMILIES and act in ("silu", "swish"))
    rms = "rms_norm_eps" in raw or (family in _GATED_FAMILIES and family not in _LAYERNORM_FAMILIES)
    out: dict[str, Any] = {
        "mlp": "gated" if gated else "gelu",
        "norm": "rmsnorm" if rms else "layernorm",
        "position": "rope" if ("rope_theta" in raw or family in _GATED_FAMILIES) else "learned",
    }
    key = next((k for k in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps") if raw.get(k) is not None), None)
    if key is not None and not (_finite_number(raw[key]) and raw[key] > 0):
        raise ValueError(f"{source}: {key} must be a positive finite number, got {raw[key]!r}")
    return out if key is None else {**out, "norm_eps": float(raw[key])}


# Our presets → the Hugging Face family that builds them.
_HF_FAMILY = {"gpt2": "gpt2", "llama-3-8b": "llama", "gemma-2-2b": "gemma2", "qwen2.5-7b": "qwen2",
              "mistral-nemo": "mistral", "user-gpt": "gpt2", "tiny": "llama"}


def preset_hf_config(name: str) -> dict:
    """A Hugging Face ``config.json`` dict with the shapes of our preset ``name``."""
    c = get_preset(name)
    family = _HF_FAMILY.get(name, "llama")
    if family == "gpt2":
        return {"model_type": "gpt2", "n_embd": c.hidden_size, "n_layer": c.num_hidden_layers,
                "n_head": c.num_attention_heads, "n_inner": c.intermediate_size, "vocab_size": c.vocab_size,
                "n_positions": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
                "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    out = {"model_type": family, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
           "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.kv_heads,
           "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
           "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
           "rms_norm_eps": c.norm_eps}
    if c.head_dim:
        out["head_dim"] = c.head_dim
    if c.final_logit_softcapping:
        out["final_logit_softcapping"] = c.final_logit_softcapping
    return out
