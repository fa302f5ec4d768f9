"""Record a training step from inside the user's own loop: phases, allocator snapshot, attribution.

``StepRecorder(model, out, steps=(2, 50))`` counts steps; ``with recorder.step(): ...`` around
one step (forward, loss, backward, optimizer) records it when its index is one of ``steps``
and is a plain counter check otherwise: no hook, no profiler, nothing allocated
(:data:`NOOP` is returned). A recorded step:

1. synchronises, locates the LM head (:func:`profiler.models.head.locate_head`, once per
   recorder) and reads what is alive and reserved before it starts;
2. marks phases through hooks — ``forward`` at the start; ``loss`` at the end of the final
   norm's forward, the LM head's forward pre-hook or the end of the model's forward
   (whichever comes first); ``backward`` when ``Tensor.backward``/``torch.autograd.backward``
   is called (the two are wrapped for the recorded step only: autograd has no hook for "a
   backward begins"); ``optimizer`` from a global optimizer step pre-hook. Phases only move
   forward (a final norm re-run by activation checkpointing in backward marks nothing);
   :meth:`StepRecorder.mark` sets one explicitly;
3. meters every phase: on CUDA the caching allocator's counters (peak allocated and
   reserved per phase, device use at each mark), on the CPU the profiler's memory events
   (:mod:`profiler.protocol`); optionally (``trace``) wraps the step in
   :class:`profiler.trace.StepTracer` for the peak by module and kind and the logits
   detector; optionally (``snapshot``, CUDA) records the allocator's history and stores the
   raw snapshot and its timeline (:mod:`profiler.snapshot`);
4. appends a :class:`~profiler.recording.records.RecordedStep` to the folder's
   ``recorded_steps.jsonl`` and writes ``environment.json`` once.

A failure of the recorder itself never stops the user's training: it is reported with
:func:`warnings.warn` and the step runs unrecorded. On a distributed run only rank 0 records.

Public API: :class:`StepRecorder`, :data:`NOOP` (the public face, which also renders the
report, is :mod:`fusedce_profile`).
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from profiler import store
from profiler.models.head import Head, locate_head
from profiler.protocol import MemoryMeter, _MARK_PREFIX, _replay_cpu_events, memory_source
from profiler.recording.records import PHASES, EvalPass, PhaseMemory, RecordedStep, append_recorded_step

#: What :meth:`StepRecorder.step` returns on a step that is not recorded (reusable, stateless).
NOOP = contextlib.nullcontext()


def _tensor_bytes(tensors) -> int:
    seen: dict[tuple, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _optimizer_tensors(optimizer, device: torch.device) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", optimizer)  # Lightning's / accelerate's wrappers
    state = getattr(inner, "state", {}) or {}
    return [v for s in state.values() for v in (s.values() if isinstance(s, dict) else ())
            if isinstance(v, torch.Tensor) and v.device == device]


def _dtype_name(dtype) -> str | None:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def _autocast_dtype(device_type: str) -> str | None:
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return _dtype_name(torch.get_autocast_dtype(device_type))
    except TypeError:  # torch < 2.4
        enabled = torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()
        if not enabled:
            return None
        dtype = torch.get_autocast_gpu_dtype() if device_type == "cuda" else torch.get_autocast_cpu_dtype()
        return _dtype_name(dtype)


def _is_rank_zero() -> bool:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def batch_shape(obj) -> tuple[int, int] | None:
    """(B, T) of the first 2-D integer tensor in ``obj`` (a tensor, a dict — ``input_ids``
    first —, a list/tuple or an object with ``input_ids``), else ``None``."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 2 and not obj.is_floating_point() and obj.dtype != torch.bool:
            return int(obj.shape[0]), int(obj.shape[1])
        return None
    if isinstance(obj, dict):
        values = ([obj["input_ids"]] if "input_ids" in obj else []) + list(obj.values())
        for value in values:
            found = batch_shape(value)
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for value in obj:
            found = batch_shape(value)
            if found:
                return found
        return None
    ids = getattr(obj, "input_ids", None)
    return batch_shape(ids) if isinstance(ids, torch.Tensor) else None


# --- the model's landmarks -----------------------------------------------------------------

def _hf_owner(model: nn.Module) -> nn.Module | None:
    """The first module (the model itself or a descendant) with a working get_output_embeddings()."""
    for module in model.modules():
        get = getattr(module, "get_output_embeddings", None)
        if callable(get):
            try:
                if get() is not None:
                    return module
            except (NotImplementedError, AttributeError):
                continue
    return None


def find_head(model: nn.Module, *, vocab: int | None = None, head_path: str | None = None) -> Head | None:
    """The LM head of ``model`` (a LightningModule or any wrapper works: a Hugging Face model
    inside is found by its get_output_embeddings()); ``None`` when nothing fits."""
    if head_path:
        return locate_head(model, vocab=vocab, head_path=head_path)
    owner = _hf_owner(model)
    try:
        head = locate_head(owner if owner is not None else model, vocab=vocab)
    except ValueError:
        return None
    if owner is not None and owner is not model:
        prefix = next(name for name, m in model.named_modules() if m is owner)
        head.info.path = f"{prefix}.{head.info.path}" if prefix else head.info.path
        head.info.weight = f"{prefix}.{head.info.weight}"
        head.info.weight_aliases = [f"{prefix}.{a}" for a in head.info.weight_aliases]
        head.info.bias = f"{prefix}.{head.info.bias}" if head.info.bias else None
    return head


def find_final_norm(model: nn.Module, head: Head | None) -> nn.Module | None:
    """The last module (in registration order) whose class name contains "norm", outside the head."""
    inside = {id(m) for m in head.module.modules()} if head is not None else set()
    norms = [m for m in model.modules() if "norm" in type(m).__name__.lower() and id(m) not in inside
             and not any("norm" in type(c).__name__.lower() for c in m.children())]
    return norms[-1] if norms else None


def find_embedding(model: nn.Module, vocab: int | None) -> nn.Module | None:
    owner = _hf_owner(model)
    if owner is not None:
        try:
            emb = owner.get_input_embeddings()
            if isinstance(emb, nn.Module):
                return emb
        except (NotImplementedError, AttributeError):
            pass
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    matching = [m for m in embeddings if vocab is not None and m.num_embeddings == vocab]
    return (matching or embeddings or [None])[0]


def model_config(model: nn.Module):
    """The first ``config`` attribute with attention-head counts in the module tree, else ``None``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and any(isinstance(getattr(config, a, None), int)
                                      for a in ("num_attention_heads", "n_head")):
            return config
    return None


def _describe_model(model: nn.Module) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({count / 1e6:.1f} M parameters)"


# --- meters ----------------------------------------------------------------------------------

class _CudaPhaseMeter(MemoryMeter):
    """:class:`MemoryMeter` that also keeps each phase's reserved high-water mark and the
    device's use when the phase closes."""

    def __init__(self, device) -> None:
        super().__init__(device)
        self.reserved: dict[str, int] = {}
        self.used: dict[str, int] = {}

    def _close_cuda(self, now: int) -> None:
        name = self._open[0]
        self.reserved[name] = torch.cuda.max_memory_reserved(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        self.used[name] = total - free
        super()._close_cuda(now)


class _SharedProfilerMeter(MemoryMeter):
    """CPU meter that reads the memory events of a profiler someone else runs (the tracer):
    two profilers cannot record at once."""

    def __init__(self, device, baseline_bytes: int, owner) -> None:
        super().__init__(device, baseline_bytes)
        self._owner = owner

    def __enter__(self) -> "_SharedProfilerMeter":
        return self

    def mark(self, name: str) -> None:
        if name in self._names:
            raise ValueError(f"phase {name!r} was already marked")
        self._names.append(name)
        with torch.profiler.record_function(_MARK_PREFIX + name):
            pass

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.record.phases = _replay_cpu_events(self._owner.profiler, self._names, self.record.baseline_bytes)


# --- one recorded step -----------------------------------------------------------------------

class _Recording:
    """The hooks, meter, tracer and snapshot of one recorded step (see the module docstring)."""

    def __init__(self, recorder: "StepRecorder", index: int) -> None:
        self.recorder, self.index = recorder, index
        self.marked: list[str] = []
        self.handles: list = []
        self.patched: list[tuple[object, str, object]] = []
        self.head_called = False
        self.autocast: str | None = None
        self.shape: tuple[int, int] | None = recorder._shape_hint()
        self.optimizers: list = []
        self.notes: list[str] = []
        self.meter = self.tracer = self.snapshot = None
        self.loss: float | None = None

    # context manager form
    def __enter__(self) -> "_Recording":
        self.recorder._begin(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.recorder._end(self, ok=exc_type is None)
        return False

    def mark(self, name: str) -> None:
        """Begin phase ``name`` (ignored when that phase or a later one has begun)."""
        if name in self.marked:
            return
        if name in PHASES:
            current = max((PHASES.index(m) for m in self.marked if m in PHASES), default=-1)
            if PHASES.index(name) <= current:
                return
        if name == "loss" and self.autocast is None:
            self.autocast = _autocast_dtype(self.recorder.device.type)
        self.marked.append(name)
        self.meter.mark(name)
        if self.tracer is not None:
            self.tracer.mark(name)
            if name == "backward":
                self.tracer.mark("backward-start")
        if name == "backward" and self.snapshot is not None:
            self.snapshot.mark_backward()

    # hooks
    def install(self, model: nn.Module, head: Head | None, norm: nn.Module | None, embedding: nn.Module | None):
        if embedding is not None and self.shape is None:
            def on_embedding(module, args, kwargs):
                if self.shape is None:
                    self.shape = batch_shape(list(args) + list(kwargs.values()))
            self.handles.append(embedding.register_forward_pre_hook(on_embedding, with_kwargs=True))
        if norm is not None:
            self.handles.append(norm.register_forward_hook(lambda *_: self.mark("loss")))
        if head is not None:
            def on_head(*_):
                self.head_called = True
                self.mark("loss")
            self.handles.append(head.module.register_forward_pre_hook(on_head))
        self.handles.append(model.register_forward_hook(lambda *_: self.mark("loss")))

        def on_optimizer(optimizer, args, kwargs):
            if all(o is not optimizer for o in self.optimizers):
                self.optimizers.append(optimizer)
            # step(closure) runs the forward and backward inside step() (Lightning's automatic
            # optimisation): the update begins after the closure, which the integration marks.
            if kwargs.get("closure") is None and not (args and callable(args[0])):
                self.mark("optimizer")
        self.handles.append(register_optimizer_step_pre_hook(on_optimizer))
        self._wrap(torch.Tensor, "backward")
        self._wrap(torch.autograd, "backward")

    def _wrap(self, owner, name: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.mark("backward")
            return original(*args, **kwargs)

        wrapped.__wrapped__ = original
        setattr(owner, name, wrapped)
        self.patched.append((owner, name, original))

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for owner, name, original in reversed(self.patched):
            setattr(owner, name, original)
        self.patched.clear()


class StepRecorder:
    """Record the named steps of a training loop into the run folder ``out``.

    ``model``: the module being trained (a LightningModule or a wrapper is fine: the LM head
    is located inside it); ``steps``: 0-based indices of the steps to record (the recorder
    counts :meth:`step` calls, or takes the index given to it). ``label``: a name for this
    run in the report (``"naive"``, ``"fused"``); ``fused``: whether the loss is meant to be
    fused (``True``/``False``/``None``: not said). ``head``: the LM head's attribute path
    when it cannot be found (default: ``get_output_embeddings()``, else the last
    ``nn.Linear`` with ``out_features`` = ``vocab``); ``vocab``, ``batch``, ``seq``: when not
    found from the head and the input ids. ``trace``: attribute the peak by module and kind
    (``torch.profiler``; slows the recorded step); ``snapshot``: store the CUDA allocator
    snapshot. ``force``: replace a recording already in ``out`` (else ``FileExistsError``);
    ``append``: add to it instead (another run of the same model, e.g. with the fused loss: the
    report compares runs by ``label``).
    ``on_record(folder)``: called after each record is written (the public API renders the
    report there).
    """

    def __init__(self, model: nn.Module, out: str | Path, *, steps: Iterable[int] = (2,), label: str = "",
                 fused: bool | None = None, head: str | None = None, vocab: int | None = None,
                 batch: int | None = None, seq: int | None = None, trace: bool = True, snapshot: bool = True,
                 force: bool = False, append: bool = False,
                 on_record: Callable[[Path], None] | None = None) -> None:
        self.model, self.out = model, Path(out)
        self.steps = frozenset(int(s) for s in steps)
        if any(s < 0 for s in self.steps):
            raise ValueError(f"steps must be 0-based step indices (≥ 0), got {sorted(self.steps)}")
        self.label, self.fused, self.head_path = label, fused, head
        self.vocab, self.batch, self.seq = vocab, batch, seq
        self.trace, self.snapshot, self.on_record = trace, snapshot, on_record
        self.count = 0
        self.records: list[RecordedStep] = []
        self.passes: list[EvalPass] = []
        self.enabled = _is_rank_zero()
        self._done: set[int] = set()
        self._active: _Recording | None = None
        self._open_pass: EvalPass | None = None
        self._located = False
        self._head = self._norm = self._embedding = None
        self._lock = None
        if self.enabled:
            self._prepare_folder(force, append)

    # -- folder -------------------------------------------------------------------------
    def _prepare_folder(self, force: bool, append: bool) -> None:
        existing = self.out / store.RECORDED_STEPS_FILE
        if existing.exists() and append:
            self._lock = store.RunLock(self.out).acquire()
            return
        if existing.exists() and not force:
            raise FileExistsError(f"{self.out} already holds a recording ({store.RECORDED_STEPS_FILE}); "
                                  "pass force=True to replace it, append=True to add to it, or another folder")
        self._lock = store.RunLock(self.out).acquire()
        if existing.exists():
            existing.unlink()
            for old in (self.out / store.SNAPSHOTS_DIR).glob("step-*"):
                old.unlink()

    def close(self) -> None:
        """End an open recording and release the folder (also done when the process exits)."""
        if self._active is not None:
            self._end(self._active, ok=True)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- the public per-step API ------------------------------------------------------------
    def step(self, index: int | None = None):
        """The context of one step: records it if its index is in ``steps``, else :data:`NOOP`.

        ``index``: the step's 0-based index (default: the number of earlier :meth:`step` calls).
        """
        index = self.count if index is None else int(index)
        self.count = index + 1
        if not self.enabled or index not in self.steps or index in self._done or self._active is not None:
            return NOOP
        return _Recording(self, index)

    def wants(self, index: int) -> bool:
        """Whether step ``index`` would be recorded (for integrations that start and end a
        recording from separate callbacks)."""
        return self.enabled and index in self.steps and index not in self._done and self._active is None

    def start(self, index: int) -> None:
        """Begin recording step ``index`` (the callbacks' form of ``with recorder.step(index)``)."""
        if self.wants(index):
            self.count = index + 1
            self._begin(_Recording(self, index))

    def finish(self, loss: float | None = None) -> RecordedStep | None:
        """End the recording begun by :meth:`start`; returns its record (``None`` if none)."""
        active = self._active
        if active is None:
            return None
        active.loss = loss if loss is not None else active.loss
        return self._end(active, ok=True)

    def abort(self) -> None:
        """End the recording begun by :meth:`start` without writing it (the step failed)."""
        if self._active is not None:
            self._end(self._active, ok=False)

    @property
    def recording(self) -> bool:
        return self._active is not None

    def mark(self, name: str) -> None:
        """Begin phase ``name`` of the step being recorded (a no-op otherwise): ``"loss"``,
        ``"backward"``, ``"optimizer"`` override the hooks' marks; other names add a phase."""
        if self._active is not None:
            try:
                self._active.mark(name)
            except Exception as exc:  # noqa: BLE001 - never break the user's step
                warnings.warn(f"fusedce-profile: mark({name!r}) failed: {exc}", RuntimeWarning, stacklevel=2)

    def set_loss(self, loss) -> None:
        if self._active is not None and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._active.loss = float(loss.detach())

    def set_batch(self, batch) -> None:
        """Take (B, T) from a batch (the first 2-D integer tensor), for the step being recorded."""
        if self._active is not None and self._active.shape is None:
            self._active.shape = batch_shape(batch)

    # -- evaluation passes ------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        param = next(self.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def _reserved(self) -> tuple[int | None, int | None]:
        device = self.device
        if device.type != "cuda":
            return None, None
        return torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device)

    def begin_pass(self, kind: str, before_step: int) -> None:
        """An evaluation pass (``"sanity check"``, ``"validation"``, ``"evaluation"``) begins."""
        if not self.enabled or self._open_pass is not None:
            return
        reserved, high = self._reserved()
        self._open_pass = EvalPass(kind, int(before_step), reserved, None, high, None)

    def end_pass(self) -> None:
        if self._open_pass is None:
            return
        self._open_pass.reserved_after, self._open_pass.max_reserved_after = self._reserved()
        self.passes.append(self._open_pass)
        self._open_pass = None

    def add_pass(self, kind: str, before_step: int, reserved_before: int | None, max_reserved_before: int | None):
        """A pass whose start was seen elsewhere (Hugging Face has no "evaluation begins" event)."""
        if not self.enabled:
            return
        reserved, high = self._reserved()
        self.passes.append(EvalPass(kind, int(before_step), reserved_before, reserved, max_reserved_before, high))

    # -- internals ------------------------------------------------------------------------------
    def _shape_hint(self) -> tuple[int, int] | None:
        if self.batch and self.seq:
            return self.batch, self.seq
        return None

    def _locate(self) -> None:
        if self._located:
            return
        self._located = True
        try:
            self._head = find_head(self.model, vocab=self.vocab, head_path=self.head_path)
        except ValueError as exc:
            warnings.warn(f"fusedce-profile: {exc}", RuntimeWarning, stacklevel=3)
            self._head = None
        vocab = self.vocab or (self._head.info.vocab if self._head else None)
        self.vocab = vocab
        self._norm = find_final_norm(self.model, self._head)
        self._embedding = find_embedding(self.model, vocab)

    def _begin(self, rec: _Recording) -> None:
        try:
            self._start(rec)
        except Exception as exc:  # noqa: BLE001 - the user's step must run whatever happens here
            self._abandon(rec, exc)

    def _start(self, rec: _Recording) -> None:
        from profiler.snapshot import SnapshotRecorder
        from profiler.trace import StepTracer

        device = self.device
        self._locate()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        params = list(self.model.parameters())
        rec.parameters = _tensor_bytes(params)
        rec.gradients = _tensor_bytes(p.grad for p in params)
        rec.reserved_at_start, rec.max_reserved_before = self._reserved()
        rec.started = time.perf_counter()
        self._active = rec
        rec.install(self.model, self._head, self._norm, self._embedding)
        if device.type == "cuda" and self.snapshot:
            rec.snapshot = SnapshotRecorder(device)
            rec.snapshot.start()
        if self.trace:
            rec.tracer = StepTracer().__enter__()
        if device.type == "cuda":
            rec.meter = _CudaPhaseMeter(device)
        elif rec.tracer is not None:
            rec.meter = _SharedProfilerMeter(device, rec.parameters + rec.gradients, rec.tracer)
        else:
            rec.meter = MemoryMeter(device, baseline_bytes=rec.parameters + rec.gradients)
        rec.meter.__enter__()
        rec.mark("forward")

    def _abandon(self, rec: _Recording, exc: BaseException) -> None:
        warnings.warn(f"fusedce-profile: step {rec.index} is not recorded: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=4)
        rec.remove_hooks()
        for part in (rec.meter, rec.tracer):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.__exit__(type(exc), exc, None)
        if rec.snapshot is not None:
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(enabled=None)
        self._active = None
        self._done.add(rec.index)

    def _end(self, rec: _Recording, ok: bool) -> RecordedStep | None:
        if self._active is not rec:
            return None
        device = self.device
        try:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            time_ms = (time.perf_counter() - rec.started) * 1e3
            rec.remove_hooks()
            shared = isinstance(rec.meter, _SharedProfilerMeter)  # reads the tracer's finished events
            if not shared:
                rec.meter.__exit__(None, None, None)
            if rec.tracer is not None:
                rec.tracer.__exit__(None, None, None)
            if shared:
                rec.meter.__exit__(None, None, None)
            self._active = None
            self._done.add(rec.index)
            if not ok:
                if rec.snapshot is not None:
                    torch.cuda.memory._record_memory_history(enabled=None)
                return None
            record = self._record(rec, device, time_ms)
        except Exception as exc:  # noqa: BLE001
            self._abandon(rec, exc)
            return None
        try:
            append_recorded_step(self.out, record)
            self._save_environment()
            self.records.append(record)
            if self.on_record is not None:
                self.on_record(self.out)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"fusedce-profile: writing step {rec.index} to {self.out} failed: {exc}",
                          RuntimeWarning, stacklevel=3)
        return record

    def _save_environment(self) -> None:
        from profiler.environment import collect_environment, save_environment

        if not (self.out / store.ENVIRONMENT_FILE).is_file() or len(self.records) == 0:
            save_environment(self.out, collect_environment())

    def _record(self, rec: _Recording, device: torch.device, time_ms: float) -> RecordedStep:
        meter = rec.meter
        cuda = device.type == "cuda"
        optimizer_bytes = (_tensor_bytes(t for o in rec.optimizers for t in _optimizer_tensors(o, device))
                           if rec.optimizers else None)
        shift = (optimizer_bytes or 0) if not cuda else 0  # the CPU baseline did not know the optimizer
        phases = []
        for p in meter.record.phases:
            phases.append(PhaseMemory(p.name, p.start_bytes + shift, p.end_bytes + shift, p.peak_bytes + shift,
                                      meter.reserved.get(p.name) if cuda else None,
                                      meter.used.get(p.name) if cuda else None))
        peak = max(phases, key=lambda p: p.peak_allocated)
        batch, seq = rec.shape or (0, 0)
        head = self._head
        notes = list(rec.notes)
        if "loss" not in rec.marked:
            notes.append("no loss phase: neither the final norm, the LM head nor the model's forward ran before "
                         "backward; the forward phase covers the loss (call recorder.mark('loss') to split it)")
        if "backward" not in rec.marked:
            notes.append("backward() was not called in the recorded step")
        if "optimizer" not in rec.marked:
            notes.append("no optimizer step ran in the recorded step")
        if head is None:
            notes.append("no LM head found: the logits detector needs the vocabulary (pass head= or vocab=)")
        if rec.shape is None:
            notes.append("the batch's shape was not seen (no integer input ids reached the embedding): pass "
                         "batch= and seq=")
        record = RecordedStep(
            step=rec.index, label=self.label, model=_describe_model(self.model), device=str(device),
            source=memory_source(device), phases=phases, peak_allocated=peak.peak_allocated,
            peak_phase=peak.name, baseline_allocated=phases[0].start_allocated, parameters=rec.parameters,
            gradients_at_start=rec.gradients, optimizer_state=optimizer_bytes, time_ms=time_ms,
            batch=batch, seq=seq, tokens=batch * seq, vocab=self.vocab, hidden=head.info.hidden if head else None,
            autocast=rec.autocast,
            parameter_dtype=_dtype_name(next(self.model.parameters()).dtype),
            fused=self.fused, reserved_at_start=rec.reserved_at_start, max_reserved_before=rec.max_reserved_before,
            head=asdict(head.info) if head else None, head_called=rec.head_called,
            passes_before=[p for p in self.passes if p.before_step <= rec.index], loss=rec.loss, notes=notes)
        if cuda:
            record.peak_reserved = meter.record.peak_reserved_bytes
            free, total = torch.cuda.mem_get_info(device)
            record.device_used = total - free
            record.context = record.device_used - torch.cuda.memory_reserved(device)
            record.smi_peak = record.context + (record.peak_reserved or 0)
        if rec.tracer is not None:
            record.attribution = self._attribute(rec, device, optimizer_bytes or 0, batch, seq)
            record.attribution.metered_peak_bytes = record.peak_allocated
        if rec.snapshot is not None:
            stem = self.out / store.SNAPSHOTS_DIR / (f"step-{rec.index}" + (f"-{_slug(self.label)}" if self.label else ""))
            pickle_path, timeline_path = rec.snapshot.save(stem)
            record.snapshot = str(pickle_path.relative_to(self.out))
            record.timeline = str(timeline_path.relative_to(self.out))
        return record

    def _attribute(self, rec: _Recording, device: torch.device, optimizer_bytes: int, batch: int, seq: int):
        from profiler.trace import attribute

        params = list(self.model.parameters())
        if device.type == "cuda":  # what the allocator held at the start besides parameters and state
            start = rec.meter.record.phases[0].start_bytes if rec.meter.record.phases else 0
            other = start - rec.parameters - optimizer_bytes
        else:  # the CPU profiler sees only the step's own allocations; earlier gradients may be freed in it
            other = rec.gradients
        static = {"parameters": rec.parameters, "optimizer state": optimizer_bytes,
                  "batch and other static": max(other, 0)}
        grad_ptrs = {p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None}
        config = model_config(self.model)
        heads = [h for h in (getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None),
                             getattr(config, "n_head", None)) if isinstance(h, int) and h > 0]
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
        attribution = attribute(rec.tracer, device=device, model=self.model,
                                head=self._head.module if self._head else None, static=static, grad_ptrs=grad_ptrs,
                                batch=batch or 1, seq=seq or 1, vocab=self.vocab or 0, heads=heads or [1],
                                layers=int(layers))
        # The recorder marks "backward-start" with "backward": one phase, named "backward".
        if attribution.peak_phase == "backward-start":
            attribution.peak_phase = "backward"
        for tensor in attribution.large_tensors:
            if tensor.phase == "backward-start":
                tensor.phase = "backward"
        return attribution


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:40]
