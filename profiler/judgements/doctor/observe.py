"""What ``doctor`` observes of one loss call on the user's model: the evidence its checks read.

:func:`observe` runs ``loss_fn(model, batch)`` and its backward once, under the doctor's
precision, and returns an :class:`Observation`:

- the loss value (or the exception it raised);
- every parameter's gradient, by name (``None`` where the loss put none). The embedding
  lookup's own gradient is left out (a forward hook detaches the lookup from the weight), so
  the gradient of a (V, H) parameter is exactly what the loss's use of it put there — tied or
  not;
- the gradient of the body's output, position by position: the input of the module that
  produces the LM head's input (the final norm), captured with a tensor hook. Norm and head
  act on each position alone, so a position gets zero gradient there exactly when the loss
  ignores it;
- every call starts from the same random state (:func:`same_random_draws`), so a model's dropout
  masks are the same in the reference's forward and in the loss's;
- the tensors of the head's shape, (V, H) or its transpose, that the loss passed to any torch
  function after the body's output was produced and that are not parameters and not in the
  graph (a detached or stale copy of the weight), seen through a ``TorchFunctionMode``.

:func:`find_landmarks` locates, once, the module producing the head's input (matched by data
pointer and shape: Hugging Face heads read a view of the norm's output) and the input embedding.

Public API: :class:`Landmarks`, :func:`find_landmarks`, :class:`CallSite`, :class:`Observation`, :func:`observe`,
:func:`naive_loss`, :func:`same_random_draws`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.overrides import TorchFunctionMode

from fusedce_profiler.instrument.callables import what_it_raised
from fusedce_profiler.instrument.models.head import tensor_of
from fusedce_profiler.instrument.models.source import BuiltModel
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.judgements.doctor.loss_options import LossOptions, shifted_cross_entropy


@dataclass
class Landmarks:
    """``producer``: the module whose output the head reads (``None`` when a plain function
    produces it); ``producer_name``; ``is_norm``: its class name says it is a norm;
    ``embedding``: the input embedding module (``None`` if there is none); ``source``: the
    module whose output the producer reads (the last block), where the body's per-position
    gradient is captured — it runs even when a loss skips the final norm."""

    producer: nn.Module | None
    producer_name: str
    is_norm: bool
    embedding: nn.Module | None
    source: nn.Module | None = None  # the module whose output the producer reads (the last block)


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape)


def _float_input(args, kwargs) -> torch.Tensor | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def find_landmarks(built: BuiltModel, input_ids: torch.Tensor, mode: str) -> Landmarks:
    """Run the model's forward once (no grad) and find the module whose output the head reads."""
    model, head = built.module, built.head.module
    names = {id(m): n for n, m in model.named_modules()}
    inside_head = {id(m) for m in head.modules()}
    # key (data pointer, shape) -> (module, when its forward began). Every output is kept alive
    # until the forward ends, so no freed block is reused and a key names one tensor (or views
    # of it, as a head reading a view of the norm's output): the match does not depend on the
    # allocator. An enclosing module returning its child's output keeps the child.
    produced: dict[tuple, tuple[nn.Module, int]] = {}
    alive: list[torch.Tensor] = []
    inputs: dict[int, tuple] = {}
    started: dict[int, int] = {}
    wanted: list[tuple] = []
    handles = []
    clock = [0]

    def on_input(module, args, kwargs):
        clock[0] += 1
        started[id(module)] = clock[0]
        x = _float_input(args, kwargs)
        if x is not None:
            inputs[id(module)] = _key(x)

    def on_output(module, args, kwargs, output):
        out = tensor_of(output)
        if out is None or not out.is_floating_point() or _float_input(args, kwargs) is None:
            return
        alive.append(out)
        key = _key(out)
        previous = produced.get(key)
        if previous is not None and previous[1] >= started[id(module)]:
            return  # produced by a module running inside this one
        produced[key] = (module, started[id(module)])

    for module in model.modules():
        if module is not model and id(module) not in inside_head:
            handles.append(module.register_forward_pre_hook(on_input, with_kwargs=True))
            handles.append(module.register_forward_hook(on_output, with_kwargs=True))
    handles.append(head.register_forward_pre_hook(
        lambda mod, args: wanted.append(_key(args[0])) if args and isinstance(args[0], torch.Tensor) else None))
    try:
        with torch.no_grad(), autocast(mode, input_ids.device):
            built.call(input_ids)
    finally:
        for h in handles:
            h.remove()
    alive.clear()
    producer = produced[wanted[0]][0] if wanted and wanted[0] in produced else None
    embedding = None
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        with contextlib.suppress(NotImplementedError, AttributeError):
            embedding = get()
    if embedding is None:
        embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    name = names.get(id(producer), "") if producer is not None else ""
    source = produced.get(inputs.get(id(producer)), (None,))[0] if producer is not None else None
    return Landmarks(producer, name, producer is not None and "norm" in type(producer).__name__.lower(), embedding,
                     source)


@dataclass
class SeenTensor:
    """A tensor of the head's shape that the loss used, a leaf that is not a parameter of the model
    (detached, or a copy made to require grad on its own)."""

    shape: tuple
    dtype: str
    equals_weight: bool
    max_abs_diff: float


@dataclass
class CallSite:
    """What the loss passed to torch functions, whether or not the call then succeeded:
    ``empty``: functions given an empty floating tensor (``numel() == 0``, e.g. a ZeRO-3 shard
    read outside its gather); ``mixed``: functions given a DTensor beside plain tensors;
    ``lce_without_options``: torch's ``linear_cross_entropy`` called with ``options=None`` (its
    reference path, which materialises the N×V logits); ``dtensor_weight``: a head-shaped DTensor
    reached a torch function after the body's output existed (a loss that then fails was given the
    sharded parameter itself)."""

    empty: list[str] = field(default_factory=list)
    mixed: list[str] = field(default_factory=list)
    lce_without_options: bool = False
    dtensor_weight: bool = False  # a head-shaped DTensor reached a torch function after the body's output


def _is_dtensor(value) -> bool:
    return type(value).__name__ == "DTensor"


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a sharded model's gradient); any other tensor as it is."""
    return t.to_local() if _is_dtensor(t) else t


def _func_name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)


class _HeadShapedUse(TorchFunctionMode):
    """Records (V, H)/(H, V) leaf tensors that are not parameters, once the body's output exists,
    and the :class:`CallSite` facts of every call."""

    def __init__(self, weight: torch.Tensor, params: set[int]) -> None:
        super().__init__()
        self.weight, self.params = weight, params
        self.armed = False
        self.seen: dict[int, torch.Tensor] = {}
        self.site = CallSite()
        v, h = weight.shape
        self.shapes = {(v, h), (h, v)}

    def _note_site(self, func, values: list) -> None:
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        name = _func_name(func)
        if any(t.is_floating_point() and t.numel() == 0 and t.dim() >= 1 for t in tensors) \
                and name not in self.site.empty:
            self.site.empty.append(name)
        dtensors = [t for t in tensors if _is_dtensor(t)]
        if dtensors and len(dtensors) < len(tensors) and name not in self.site.mixed:
            self.site.mixed.append(name)
        if self.armed and any(tuple(t.shape) in self.shapes for t in dtensors):
            self.site.dtensor_weight = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        values = list(args) + list(kwargs.values())
        if torch.compiler.is_compiling() or any(isinstance(v, torch.Tensor) and is_fake(v) for v in values):
            return func(*args, **kwargs)  # dynamo's or AOT autograd's tracing (fake tensors): the eager call records
        if func is getattr(torch.nn.functional, "linear_cross_entropy", None) and kwargs.get("options") is None:
            self.site.lce_without_options = True
        self._note_site(func, values)
        if self.armed:
            for value in values:
                if (isinstance(value, torch.Tensor) and tuple(value.shape) in self.shapes and id(value) not in self.params
                        and value.grad_fn is None and id(value) not in self.seen):  # a leaf outside the model
                    self.seen[id(value)] = value
        return func(*args, **kwargs)

    def describe(self) -> list[SeenTensor]:
        out = []
        w = self.weight.detach()
        if _is_dtensor(w):
            return [SeenTensor(tuple(t.shape), str(t.dtype).replace("torch.", ""), False, float("inf"))
                    for t in self.seen.values()]
        for t in self.seen.values():
            t2 = t.detach()
            if tuple(t2.shape) != tuple(w.shape):
                t2 = t2.t()
            diff = float((t2.float() - w.float()).abs().max()) if t2.shape == w.shape else float("inf")
            out.append(SeenTensor(tuple(t.shape), str(t.dtype).replace("torch.", ""), diff == 0.0, diff))
        return out


@dataclass
class Observation:
    """One loss call and its backward (see the module docstring)."""

    loss: float | None
    error: str | None
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    body_grad: torch.Tensor | None = None
    seen: list[SeenTensor] = field(default_factory=list)
    requires_grad: bool = True
    site: CallSite = field(default_factory=CallSite)

    def grad(self, name: str) -> torch.Tensor | None:
        return self.grads.get(name)


#: The seed every observed call starts from: the model's dropout draws the same masks in each.
OBSERVE_SEED = 0


@contextlib.contextmanager
def same_random_draws(device: torch.device):
    """Run the body from the same random state, and restore the caller's afterwards.

    A model in training mode draws dropout masks; two calls of its forward (the reference and the
    user's loss, or the same loss in two precisions) compare only when they draw the same ones. Both
    run the model's modules in the same order, so seeding before each call gives each the same masks.
    """
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(OBSERVE_SEED)
        yield


def observe(built: BuiltModel, landmarks: Landmarks, loss_fn: Callable, batch: dict, mode: str,
            record_calls: bool = True) -> Observation:
    """Call ``loss_fn(model, batch)`` and backward; capture the evidence (never raises for the
    loss's own failures: they are returned as ``error``). ``record_calls=False``: the calls the
    loss makes are not watched (a ``TorchFunctionMode`` under ``torch.compile`` changes what
    dynamo traces)."""
    model = built.module
    model.zero_grad(set_to_none=True)
    captured: dict[str, torch.Tensor] = {}
    handles = []
    names = {id(p): n for n, p in model.named_parameters()}
    use = _HeadShapedUse(built.head.weight, set(names))

    def capture(x) -> None:
        if isinstance(x, torch.Tensor) and x.requires_grad and "body" not in captured:
            captured["body"] = None  # one capture per call (checkpointing re-runs forwards in backward)
            x.register_hook(lambda g: captured.__setitem__("body", g.detach().float().clone()))

    def arm(*_):
        use.armed = True

    if landmarks.source is not None:  # the body's output, where the final norm reads it
        handles.append(landmarks.source.register_forward_hook(lambda mod, args, out: (capture(tensor_of(out)),
                                                                                        arm())[-1]))
    elif landmarks.producer is not None:
        handles.append(landmarks.producer.register_forward_pre_hook(
            lambda mod, args, kwargs: capture(_float_input(args, kwargs)), with_kwargs=True))
    if landmarks.producer is not None:
        handles.append(landmarks.producer.register_forward_hook(arm))
    else:
        use.armed = True
    if landmarks.embedding is not None:
        # Detach the lookup from the weight: a (V, H) parameter's gradient is then the loss's alone.
        def detach_lookup(module, args, output):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                return output.detach().requires_grad_(torch.is_grad_enabled())
            return output

        handles.append(landmarks.embedding.register_forward_hook(detach_lookup))
    try:
        with same_random_draws(batch["input_ids"].device), autocast(mode, batch["input_ids"].device), \
                (use if record_calls else contextlib.nullcontext()):
            loss = loss_fn(model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else ""
            raise TypeError(f"the loss must return a scalar tensor, got {type(loss).__name__}{shape}")
        value = float(loss.detach().float())
        requires_grad = loss.requires_grad
        if requires_grad:
            loss.backward()
    except Exception as exc:  # the loss's own failure is evidence, not a crash of the doctor
        model.zero_grad(set_to_none=True)
        return Observation(None, what_it_raised(exc), site=use.site)
    finally:
        for h in handles:
            h.remove()
    grads = {n: (_local(p.grad).detach().float().clone() if p.grad is not None else None)
             for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return Observation(value, None, grads, captured.get("body"), use.describe(), requires_grad, use.site)


def naive_loss(built: BuiltModel, batch: dict, store: dict | None = None,
               options: LossOptions = LossOptions()) -> torch.Tensor:
    """The reference: the model's own forward (its head, bias, tie and logit transform), then
    the shifted cross-entropy with the config's ``options`` averaged over the labels that are
    not -100, in fp32. ``store`` receives the logits, the head's raw output and the head's input
    (detached)."""
    handles = []
    if store is not None:
        head = built.head.module
        handles.append(head.register_forward_pre_hook(
            lambda mod, args: store.__setitem__("head_input", args[0].detach()) if args else None))
        handles.append(head.register_forward_hook(
            lambda mod, args, out: store.__setitem__("raw", tensor_of(out).detach())))
    try:
        logits = built.logits_of(built.call(batch["input_ids"]))
    finally:
        for h in handles:
            h.remove()
    if store is not None:
        store["logits"] = logits.detach()
    return shifted_cross_entropy(logits, batch["labels"], options)
