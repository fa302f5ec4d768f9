"""The phases of one recorded step: the hooks that mark them and the meters that measure them.

:class:`StepRecording` is what ``with recorder.step():`` enters on a recorded step. Its hooks
mark ``loss`` at the end of the final norm's forward, the LM head's forward pre-hook or the
end of the model's forward (whichever comes first), ``backward`` when ``Tensor.backward`` /
``torch.autograd.backward`` is called (the two are wrapped for the recorded step only) and
``optimizer`` from a global optimizer step pre-hook; phases only move forward. Each mark is
passed to the step's meter — :class:`CudaPhaseMeter` on CUDA, the CPU profiler's memory
events otherwise (:class:`SharedProfilerMeter` when the tracer owns the profiler) — and to
the tracer and snapshot when they run. The :class:`~fusedce_profiler.instrument.recording.recorder.StepRecorder`
decides which steps get one and starts, ends and writes it.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fusedce_profiler.instrument.models.head import Head
from fusedce_profiler.instrument.protocol import MemoryMeter, MARK_PREFIX, replay_cpu_events
from fusedce_profiler.instrument.recording.landmarks import batch_shape
from fusedce_profiler.instrument.recording.records import PHASES



def dtype_name(dtype) -> str | None:
    """``"bf16"``, ``"fp16"``, ``"fp32"`` for those dtypes, else ``str(dtype)``."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def autocast_dtype(device_type: str) -> str | None:
    """The autocast dtype in force on ``device_type`` (named as :func:`dtype_name`), ``None`` when off."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return dtype_name(torch.get_autocast_dtype(device_type))
    except TypeError:  # torch < 2.4
        enabled = torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()
        if not enabled:
            return None
        dtype = torch.get_autocast_gpu_dtype() if device_type == "cuda" else torch.get_autocast_cpu_dtype()
        return dtype_name(dtype)



class CudaPhaseMeter(MemoryMeter):
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


class SharedProfilerMeter(MemoryMeter):
    """CPU meter that reads the memory events of a profiler someone else runs (the tracer):
    two profilers cannot record at once."""

    def __init__(self, device, baseline_bytes: int, owner) -> None:
        super().__init__(device, baseline_bytes)
        self._owner = owner

    def __enter__(self) -> "SharedProfilerMeter":
        return self

    def mark(self, name: str) -> None:
        if name in self._names:
            raise ValueError(f"phase {name!r} was already marked")
        self._names.append(name)
        with torch.profiler.record_function(MARK_PREFIX + name):
            pass

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.record.phases = replay_cpu_events(self._owner.profiler.profiler, self._names,
                                                   self.record.baseline_bytes)


_TASKS = "/proc/self/task"  # Linux: one entry per thread of this process, by native id


def _task_start(native_id: int) -> str | None:
    """When thread ``native_id`` of this process began (clock ticks since boot: field 22 of its ``stat``), or
    None where there is no such thread or no such list."""
    try:
        with open(os.path.join(_TASKS, str(native_id), "stat")) as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]  # the fields after the name, from field 3 on
    except (OSError, IndexError):
        return None


# --- one recorded step -----------------------------------------------------------------------

WATCH_S = 0.5
"""How often a step begun by an integration's loop asks whether that loop has ended without it."""


class StepRecording:
    """The hooks, meter, tracer and snapshot of one recorded step (see the module docstring)."""

    def __init__(self, index: int, *, device: torch.device, shape: tuple[int, int] | None,
                 begin: Callable[["StepRecording"], None], end: Callable[["StepRecording", bool], object]) -> None:
        """Step ``index`` on ``device``; ``shape``: its (B, T) when known in advance; ``begin`` /
        ``end(recording, ok)``: called when the ``with`` block is entered / left (the recorder's)."""
        self.index, self.device = index, device
        self._begin, self._end = begin, end
        self.marked: list[str] = []
        self.handles: list = []
        self._hooks_lock, self._hooks_removed = threading.RLock(), False  # the stale-step watch's (_watch_loop)
        self.patched: list[tuple[object, str, object]] = []
        self.head_called = False
        self.autocast: str | None = None
        self.shape: tuple[int, int] | None = shape
        self.optimizers: list = []
        self.notes: list[str] = []
        self.meter = self.tracer = self.snapshot = None
        self.started: float | None = None  # ``time.perf_counter()`` as the step began (it began only if set)
        self.loss: float | None = None
        self.alive: Callable[[], bool] | None = None  # whether the loop that began it still runs (holder.loop_probe)
        self.ended_if_stale: Callable[[], bool] | None = None  # the recorder's: ends a stale step, says if it did
        self.owner = threading.current_thread()  # the thread that asked for it (``step()`` or ``start()``)
        self.native_id = threading.get_native_id()  # the operating system's id of that thread (owner_alive)
        self.native_start = _task_start(self.native_id) if isinstance(self.owner, threading._DummyThread) else None

    @property
    def thread(self) -> int:
        """The ident of :attr:`owner` (reused by a later thread once it ends: :attr:`owner` tells them apart)."""
        return self.owner.ident

    def of_this_thread(self) -> bool:
        """Whether the calling thread began the step: its :attr:`owner`, its :attr:`native_id` and, for a thread
        ``threading`` did not start (whose stand-in is handed to a later such thread given its ident, and which
        may be given its id too), the time it began."""
        return (self.owner is threading.current_thread() and self.native_id == threading.get_native_id()
                and (self.native_start is None or _task_start(self.native_id) == self.native_start))

    def owner_alive(self) -> bool:
        """Whether :attr:`owner` still runs. A thread ``threading`` did not start (a native one, or one of
        ``_thread.start_new_thread``) is a stand-in that says it is alive for ever and, between its calls into
        Python, may have no frame: told by the operating system's list of this process's threads where there is
        one (``/proc/self/task``: :attr:`native_id` there, with the start time it had), else taken as alive."""
        if isinstance(self.owner, threading._DummyThread) and self.native_start is not None:
            return _task_start(self.native_id) == self.native_start  # a later thread given its id began later
        return self.owner.is_alive()

    # context manager form
    def __enter__(self) -> "StepRecording":
        self._begin(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._end(self, exc_type is None)
        return False

    def mark(self, name: str) -> None:
        """Begin phase ``name`` (ignored when that phase or a later one has begun, and when the loop
        that began the step has ended: the step is then ended unrecorded)."""
        if name in self.marked or self.meter is None or (self.ended_if_stale is not None and self.ended_if_stale()):
            return  # meter None: the step's start has not begun measuring (another thread's backward meanwhile)
        if name in PHASES:
            current = max((PHASES.index(m) for m in self.marked if m in PHASES), default=-1)
            if PHASES.index(name) <= current:
                return
        if name == "loss" and self.autocast is None:
            self.autocast = autocast_dtype(self.device.type)
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
        if self.alive is not None and self.ended_if_stale is not None:
            self._watch_loop()
        self._wrap(torch.Tensor, "backward")
        self._wrap(torch.autograd, "backward")

    def _wrap(self, owner, name: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.mark("backward")
            return original(*args, **kwargs)

        wrapped.__wrapped__ = original
        self.patched.append((owner, name, original))  # first: a signal landing after the setattr finds it noted
        setattr(owner, name, wrapped)

    def _watch_loop(self) -> None:
        """Once the loop that began this step has ended without ending it (an exception its caller
        caught), the process's next call of any module ends it: inference on another model calls no
        hook of the recorded model's. A thread asks every :data:`WATCH_S` seconds and adds that global
        hook only then, so a step that goes as it should (a compiled model's too) runs without it."""
        def on_any_module(*_) -> None:  # a forward pre-hook: what it returns would replace the input
            try:
                self.ended_if_stale()
            except Warning:  # its warning taken as an error (-W error): the step is ended; the call goes on
                pass

        def watch() -> None:
            while True:
                time.sleep(WATCH_S)
                with self._hooks_lock:
                    if self._hooks_removed:
                        return
                    if not self.alive():
                        self.handles.append(register_module_forward_pre_hook(on_any_module))
                        return

        threading.Thread(target=watch, name="fusedce-stale-step", daemon=True).start()

    def remove_hooks(self) -> None:
        with self._hooks_lock:
            self._hooks_removed = True
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for owner, name, original in reversed(self.patched):
            setattr(owner, name, original)
        self.patched.clear()
