"""The measurement of one cell, exactly as ``../shared/ANCHORS.md`` describes it.

Per (row, mode, implementation), on inputs shared by all implementations, the
implementation being a :class:`profiler.backends.Backend` (its adapter is built fresh for
every cell: the lazy import, and for torch.compile a reset Dynamo cache):

1. one warm-up forward+backward (compilation, autotuning, cuBLAS workspace), timed by the
   wall clock and reported separately (``extra["warmup_ms"]``);
2. grads cleared, ``gc.collect(); empty_cache(); reset_peak_memory_stats()``,
   ``base = memory_allocated()``, one forward+backward: peak extra = max allocated − base,
   split into the forward's and the backward's peaks (the ``.grad`` tensors count);
3. parity of that step's loss and gradients against the fp32 reference;
4. time = median of ``repeats`` forward+backward calls, each bracketed by CUDA events
   (wall clock on CPU), grads cleared before each call outside the timed region so every
   call allocates its gradients as the measured step did.

An out-of-memory error or any other exception is recorded in the cell (``status`` "oom" /
"error") and the memory it held is released, so the run goes on. On CPU, memory is not
measured (``memory_source == "none"``).
"""
from __future__ import annotations

import gc
import math
import re
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from benchmarks.impls import installed_version
from benchmarks.protocol import Row, floor_bytes
from profiler.backends import Backend, LossOptions
from profiler.inputs import CellInputs, autocast_for
from profiler.records import CellResult, CellSpec, Parity
from profiler.reference import Reference

_COMPARE_CHUNK = 1 << 24  # elements per chunk of the error norms (bounded temporaries)
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

Step = Callable[[CellInputs], torch.Tensor]


def settle(device: str) -> None:
    """Free what can be freed and start a fresh peak: ``gc.collect(); empty_cache(); reset``."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def time_calls(fn: Callable[[], object], repeats: int, *, device: str,
               before: Callable[[], None] = lambda: None) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn`` (CUDA events, or wall clock on CPU).

    ``before`` runs ahead of every call, outside the timed region.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}")
    if device != "cuda":
        times = []
        for _ in range(repeats):
            before()
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = []
    for _ in range(repeats):
        before()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        events.append((start, stop))
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) for start, stop in events]


def relative_error(value: torch.Tensor | None, reference: torch.Tensor | None) -> float | None:
    """‖value − reference‖ / ‖reference‖ in fp64 accumulation, chunked; None if either is missing."""
    if value is None or reference is None:
        return None
    if value.shape != reference.shape:
        raise ValueError(f"value has shape {tuple(value.shape)}, reference {tuple(reference.shape)}")
    diff = torch.zeros((), dtype=torch.float64, device=reference.device)
    norm = torch.zeros((), dtype=torch.float64, device=reference.device)
    for v, r in zip(value.detach().reshape(-1).split(_COMPARE_CHUNK), reference.reshape(-1).split(_COMPARE_CHUNK)):
        r = r.double()
        diff += (v.double() - r).square().sum()
        norm += r.square().sum()
    norm = norm.item()
    return math.sqrt(diff.item() / norm) if norm > 0 else math.sqrt(diff.item())


def compare(loss: torch.Tensor, inputs: CellInputs, reference: Reference) -> Parity:
    """Relative errors of a step's loss and the inputs' ``.grad`` against the reference."""
    bias_grad = inputs.bias.grad if inputs.bias is not None else None
    return Parity(
        loss=relative_error(loss.detach().float().reshape(1), reference.loss.reshape(1)),
        grad_hidden=relative_error(inputs.hidden.grad, reference.grad_hidden),
        grad_weight=relative_error(inputs.weight.grad, reference.grad_weight),
        grad_bias=relative_error(bias_grad, reference.grad_bias),
    )


def loss_step(backend: Backend, spec: CellSpec) -> Step:
    """``step(inputs) -> loss``: the back-end's loss with the cell's options (built now).

    The loss is a 0-d tensor (the benchmark measures ``reduction="mean"``), computed under
    the caller's autocast and differentiated with ``loss.backward()``.
    """
    loss_fn = backend.make()
    options = LossOptions.from_spec(spec)
    return lambda x: loss_fn(x.hidden, x.weight, x.target, x.bias, options)


def _measure(step: Step, spec: CellSpec, inputs: CellInputs,
             reference: Reference, repeats: int, result: CellResult) -> None:
    """Steps 1–4 of the protocol, filling ``result``; raises what the implementation raises."""
    cuda = spec.device == "cuda"

    def forward_backward() -> None:
        with autocast_for(spec):
            loss = step(inputs)
        loss.backward()

    # 1. warm-up
    inputs.clear_grads()
    start = time.perf_counter()
    forward_backward()
    if cuda:
        torch.cuda.synchronize()
    result.extra["warmup_ms"] = (time.perf_counter() - start) * 1e3

    # 2. memory of one step (3. and its parity)
    inputs.clear_grads()
    settle(spec.device)
    if cuda:
        base = torch.cuda.memory_allocated()
        with autocast_for(spec):
            loss = step(inputs)
        forward_peak = torch.cuda.max_memory_allocated() - base
        forward_reserved = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        backward_peak = torch.cuda.max_memory_allocated() - base
        result.baseline_bytes = base
        result.peak_forward_bytes = forward_peak
        result.peak_backward_bytes = backward_peak
        result.peak_step_bytes = max(forward_peak, backward_peak)
        result.peak_reserved_bytes = max(forward_reserved, torch.cuda.max_memory_reserved())
    else:
        with autocast_for(spec):
            loss = step(inputs)
        loss.backward()
    result.parity = compare(loss, inputs, reference)
    del loss

    # 4. time
    times = time_calls(forward_backward, repeats, device=spec.device, before=inputs.clear_grads)
    result.times_ms = times
    result.time_ms = statistics.median(times)
    result.time_ms_min = min(times)
    result.time_ms_max = max(times)


def _requested_bytes(message: str) -> int | None:
    """The failed allocation of a CUDA out-of-memory message ("Tried to allocate 2.00 GiB")."""
    match = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", message)
    return round(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def measure_cell(backend: Backend, spec: CellSpec, inputs: CellInputs, reference: Reference, *,
                 repeats: int = 5) -> CellResult:
    """Run the protocol for ``backend`` on ``inputs``; never raises for the back-end's errors.

    ``spec.backend`` is the benchmark's name of the implementation (it goes into the
    results as is). A cell the back-end cannot run is "skipped" with its reason (not
    installed, needs CUDA, an unsupported option). Raises ``ValueError`` if
    ``spec.reduction`` is not "mean", the only reduction the protocol measures.
    """
    if spec.reduction != "mean":
        raise ValueError(f"the benchmark measures reduction='mean', got spec.reduction={spec.reduction!r}")
    row = Row(spec.tokens, spec.hidden, spec.vocab)
    result = CellResult(spec=spec, floor_bytes=floor_bytes(row, spec.mode, bias=spec.bias),
                        memory_source="cuda-allocator" if spec.device == "cuda" else "none",
                        backend_version=installed_version(backend))
    reason = backend.unsupported(spec)
    if reason is not None:
        result.status, result.message = "skipped", reason
        return result
    start = time.perf_counter()
    try:
        _measure(loss_step(backend, spec), spec, inputs, reference, repeats, result)
    except torch.OutOfMemoryError as exc:
        result.status, result.message = "oom", str(exc).splitlines()[0] if str(exc) else "out of memory"
        result.oom_requested_bytes = _requested_bytes(str(exc))
    except Exception as exc:  # recorded, not raised: one failing back-end must not end the run
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result.status, result.message = "error", f"{type(exc).__name__}: {first_line}"[:500]
    finally:
        inputs.clear_grads()
        settle(spec.device)
    result.extra["wall_s"] = time.perf_counter() - start
    if result.status != "ok":  # numbers of a step that did not finish are not results
        result.parity = Parity()
        result.times_ms, result.time_ms, result.time_ms_min, result.time_ms_max = [], None, None, None
    return result


@dataclass
class GemmRate:
    """cuBLAS bf16 ``torch.mm`` of (N, H) by (H, V) (the logits GEMM's layout) at one row."""

    tokens: int
    hidden: int
    vocab: int
    time_ms: float | None = None
    tflops: float | None = None
    message: str = ""


def measure_gemm(row: Row, *, device: str, repeats: int = 5, seed: int = 0) -> GemmRate:
    """Median time and TFLOP/s of ``torch.mm(a, w.t(), out=...)`` on random bf16 operands."""
    result = GemmRate(row.tokens, row.hidden, row.vocab)
    try:
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn(row.tokens, row.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        w = torch.randn(row.vocab, row.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        out = torch.empty(row.tokens, row.vocab, device=device, dtype=torch.bfloat16)
        # Warm-up: cuBLAS heuristics and workspace, and ~0.3 s of work so that an idle GPU's
        # clocks have ramped up (two calls were not enough for the first, small row of the
        # 2026-12-02 runs: it measured 95 TFLOP/s).
        deadline = time.perf_counter() + 0.3
        torch.mm(a, w.t(), out=out)
        while device == "cuda" and time.perf_counter() < deadline:
            torch.mm(a, w.t(), out=out)
            torch.cuda.synchronize()
        times = time_calls(lambda: torch.mm(a, w.t(), out=out), repeats, device=device)
        result.time_ms = statistics.median(times)
        result.tflops = 2 * row.tokens * row.hidden * row.vocab / (result.time_ms * 1e-3) / 1e12
    except torch.OutOfMemoryError as exc:
        result.message = f"OutOfMemoryError: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        a = w = out = None
        settle(device)
    return result
