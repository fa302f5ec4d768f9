"""Find a model's LM head and the parameter its forward actually multiplies by.

:func:`locate_head` tries, in order: an explicit ``--head attr.path``; the model's
``get_output_embeddings()`` (Hugging Face); the last ``nn.Linear`` whose ``out_features`` is
the vocabulary; the last module whose own (V, H) parameter is named ``weight``. It then
*calls* the head once on a two-row probe inside a ``TorchFunctionMode`` that records every
parameter of shape (V, ·) the call touches: that is the weight the head's forward uses,
whatever attribute a tie was assigned to. The original report's case —
``self.head = Wrapper(nn.Linear(H, V)); self.head.weight = self.embed.weight`` where the
wrapper's forward calls its inner ``Linear`` — is found as: the head's forward uses
``head.inner.weight``, which is *not* the embedding, and the tie assigned to
``head.weight`` is unused.

Public API: :class:`HeadInfo`, :class:`Head`, :func:`locate_head`, :func:`stray_weight` and
:func:`stray_weight_finding` (a weight on the head or a wrapper that its forward ignores), and :func:`tensor_of` /
:func:`first_tensor` for the hooks that read a module's input or output.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


@dataclass
class HeadInfo:
    """The JSON-storable description of a located head (what reports show).

    ``path``: the head module's attribute path; ``found_by``: how it was found; ``weight``:
    the name of the (V, H) parameter its forward uses (first name among those sharing it);
    ``weight_aliases``: every other name of that same parameter (the embedding when tied);
    ``bias``: the bias's name or ``None``; ``tied``: the used weight is the input embedding;
    ``notes``: sentences about anything surprising (an assigned tie that forward ignores, a
    head that is not a plain linear map).
    """

    path: str
    found_by: str
    weight: str
    weight_aliases: list[str] = field(default_factory=list)
    bias: str | None = None
    tied: bool = False
    vocab: int = 0
    hidden: int = 0
    plain_linear: bool = True
    notes: list[str] = field(default_factory=list)


@dataclass
class Head:
    """A located head: the module, the parameters its forward uses, and :class:`HeadInfo`."""

    module: nn.Module
    weight: nn.Parameter
    bias: nn.Parameter | None
    info: HeadInfo


class _ParameterUse(TorchFunctionMode):
    """Records the parameters passed to any torch function while active (by identity)."""

    def __init__(self, params: dict[int, nn.Parameter]) -> None:
        super().__init__()
        self.params, self.used, self.linear_calls = params, [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Tensor) and id(value) in self.params and id(value) not in self.used:
                self.used.append(id(value))
        if func is F.linear:
            self.linear_calls.append(func)
        return func(*args, **kwargs)


def _get(model: nn.Module, path: str) -> nn.Module:
    obj = model
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--head {path!r}: {type(obj).__name__} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise ValueError(f"--head {path!r} is a {type(obj).__name__}, not an nn.Module")
    return obj


def _module_path(model: nn.Module, module: nn.Module) -> str:
    for name, m in model.named_modules():
        if m is module:
            return name
    raise ValueError("the head returned by get_output_embeddings() is not a submodule of the model")


def _candidates(model: nn.Module, vocab: int | None) -> tuple[str, str] | None:
    """(path, how) of the last Linear with out_features == vocab, else of the last module owning
    a (vocab, ·) ``weight``; with ``vocab`` unknown, the last Linear of the model."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if vocab is not None:
        hits = [n for n, m in linears if m.out_features == vocab]
        if hits:
            return hits[-1], f"last nn.Linear with out_features = vocabulary ({vocab})"
        owners = [n for n, m in model.named_modules()
                  if isinstance(getattr(m, "weight", None), torch.Tensor) and not isinstance(m, nn.Embedding)
                  and m.weight.dim() == 2 and m.weight.shape[0] == vocab]
        if owners:
            return owners[-1], f"last module with a ({vocab}, H) weight"
        return None
    if linears:
        return linears[-1][0], "last nn.Linear of the model (vocabulary unknown)"
    return None


def _names_by_id(model: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def input_embedding(model: nn.Module) -> nn.Parameter | None:
    """The input embedding's weight: ``get_input_embeddings()``, else the first ``nn.Embedding``."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
            if emb is not None and isinstance(getattr(emb, "weight", None), torch.Tensor):
                return emb.weight
        except (NotImplementedError, AttributeError):
            pass
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return embeddings[0].weight if embeddings else None


def locate_head(model: nn.Module, *, vocab: int | None = None, head_path: str | None = None) -> Head:
    """The LM head of ``model`` (see the module docstring). Raises ``ValueError`` naming
    what was tried when nothing fits."""
    if head_path:
        path, how = head_path, "--head"
        module = _get(model, head_path)
    else:
        module = None
        get = getattr(model, "get_output_embeddings", None)
        if callable(get):
            try:
                module = get()
            except (NotImplementedError, AttributeError):
                module = None
        if module is not None:
            path, how = _module_path(model, module), "get_output_embeddings()"
        else:
            found = _candidates(model, vocab)
            if found is None:
                raise ValueError(f"no LM head found in {type(model).__name__}: no get_output_embeddings(), no "
                                 f"nn.Linear with out_features = {vocab}; name it with --head attr.path")
            path, how = found
            module = _get(model, path)

    names = _names_by_id(model)
    params = {id(p): p for p in model.parameters()}
    weight, bias, plain, notes = _used_parameters(module, params, vocab)
    if weight is None:
        raise ValueError(f"the head {path!r} ({type(module).__name__}) used no 2-D parameter when called: "
                         "name the LM head module with --head attr.path")
    v, h = weight.shape
    weight_names = sorted(names.get(id(weight), ["?"]), key=lambda n: (not n.startswith(path), len(n)))
    embedding = input_embedding(model)
    tied = embedding is not None and embedding is weight
    stray = stray_weight(model, path, weight)
    if stray is not None:
        owner, assigned = stray
        notes.append(stray_weight_finding(owner, names.get(id(assigned), [f"{owner}.weight"])[0], weight_names[0],
                                          embedding is not None and assigned is embedding) + ".")
    bias_name = names.get(id(bias), [None])[0] if bias is not None else None
    info = HeadInfo(path=path, found_by=how, weight=weight_names[0], weight_aliases=weight_names[1:],
                    bias=bias_name, tied=tied, vocab=int(v), hidden=int(h), plain_linear=plain, notes=notes)
    return Head(module=module, weight=weight, bias=bias, info=info)


def stray_weight(model: nn.Module, path: str, weight: nn.Parameter) -> tuple[str, nn.Parameter] | None:
    """A (V, H) ``weight`` on the head module or one of its wrappers that the head's forward
    does not multiply by: ``(owner's path, that parameter)``, the innermost first; ``None``.

    ``path``: the head module's attribute path (``head.proj``: ``head.proj`` then ``head``
    are looked at); ``weight``: the parameter its forward was seen to use.
    """
    modules = dict(model.named_modules())
    parts = path.split(".")
    for depth in range(len(parts), 0, -1):
        owner = ".".join(parts[:depth])
        candidate = getattr(modules.get(owner), "weight", None)
        if isinstance(candidate, nn.Parameter) and candidate is not weight and candidate.dim() == 2 \
                and tuple(candidate.shape) == tuple(weight.shape):
            return owner, candidate
    return None


def stray_weight_finding(owner: str, assigned: str, used: str, is_embedding: bool) -> str:
    """The one sentence every report prints about a stray head weight, and its fix.

    ``owner``: the module holding it; ``assigned``: the parameter's name; ``used``: the name of
    the weight the head's forward multiplies by; ``is_embedding``: the stray weight is the
    input embedding (a tie assigned on a wrapper).
    """
    if is_embedding:
        return (f"A tie was assigned on the head module ({owner}.weight is the input embedding {assigned}), but "
                f"its forward multiplies by {used}, its own weight: the tie assigned on the wrapper is unused, the "
                "model trains an untied head, and an optimizer step moves both. Assign the tie to the module the "
                f"forward uses ({used.rsplit('.', 1)[0]}.weight = embedding.weight)")
    return (f"{assigned} is a (V, H) parameter of the head module that its forward never uses (it multiplies by "
            f"{used}): a loss given {assigned} trains the wrong tensor")


@torch.no_grad()
def _used_parameters(module: nn.Module, params: dict[int, nn.Parameter], vocab: int | None):
    """Call ``module`` on a two-row probe; return (weight, bias, is-plain-linear, notes)."""
    own = [p for p in module.parameters() if p.dim() == 2]
    hidden = None
    if own:
        hidden = own[-1].shape[1]
    weight_guess = getattr(module, "weight", None)
    if isinstance(weight_guess, torch.Tensor) and weight_guess.dim() == 2:
        hidden = weight_guess.shape[1]
    if hidden is None:
        return None, None, False, []
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    probe = torch.randn(2, hidden, device=device, dtype=dtype) if device.type != "meta" else \
        torch.empty(2, hidden, device="meta", dtype=dtype)
    if any(type(p).__name__ == "DTensor" for p in module.parameters()):
        # A sharded (FSDP2) head cannot be called outside its owner's forward: a Linear's own
        # parameters are what it uses.
        if not isinstance(module, nn.Linear):
            return None, None, False, []
        return module.weight, module.bias, True, ["sharded: the head's parameters are DTensors"]
    tracker = _ParameterUse(params)
    with tracker:
        out = module(probe)
    out = getattr(out, "logits", out)
    used = [params[i] for i in tracker.used]
    weights = [p for p in used if p.dim() == 2 and (vocab is None or p.shape[0] == vocab) and p.shape[1] == hidden]
    if not weights:
        return None, None, False, []
    weight = weights[0]
    biases = [p for p in used if p.dim() == 1 and p.shape[0] == weight.shape[0]]
    bias = biases[0] if biases else None
    notes: list[str] = []
    plain = True
    if device.type != "meta" and isinstance(out, torch.Tensor):
        expected = F.linear(probe, weight, bias)
        plain = out.shape == expected.shape and torch.allclose(out.float(), expected.float(), rtol=1e-3, atol=1e-3)
        if not plain:
            notes.append("the head's forward is not a plain linear map of its input (it scales, caps or adds "
                         "something): the fused back-ends compute F.linear(h, W, b) and may train a different loss.")
    return weight, bias, plain, notes


def tensor_of(value) -> torch.Tensor | None:
    """The tensor a module's input or output carries: the tensor itself, a model output's
    ``last_hidden_state``, or the first item of a tuple/list; ``None`` if none of these."""
    if isinstance(value, torch.Tensor):
        return value
    hidden = getattr(value, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """:func:`tensor_of` the first positional or keyword argument (in that order) that carries one."""
    for value in list(args) + list(kwargs.values()):
        tensor = tensor_of(value)
        if tensor is not None:
            return tensor
    return None
