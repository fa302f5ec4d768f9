"""Model-mode jobs: one back-end's measured training step, in this process or a fresh one.

A :class:`ModelJob` says what to run; :func:`run_job` runs it here and returns a
:class:`ModelResult`; :func:`run_job_in_worker` runs it in a fresh worker process
(:mod:`fusedce_profiler.instrument.worker`) so that one back-end's allocator cache, compiled kernels or crash
cannot affect the next. Out-of-memory is a result (``status="oom"``), not
an exception; so is a back-end that cannot run here (``"skipped"``) and any other failure
(``"error"``, with the message).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fusedce_profiler.instrument import oom, store
from fusedce_profiler.instrument.callables import message_of
from fusedce_profiler.instrument.backends import Replacement
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.models.head import HeadInfo
from fusedce_profiler.instrument.models.source import (BuiltinSource, FactoryRaised, MissingDependency, ModelSource,
                                                    source_from_dict)
from fusedce_profiler.instrument.step.losses import BackendUnavailable, loss_options, resolve_step_loss
from fusedce_profiler.instrument.records import STATUSES, is_backend_name
from fusedce_profiler.instrument.schema import checked_fields
from fusedce_profiler.instrument.precision import TRAINING_MODES, canonical_mode
from fusedce_profiler.instrument.tracing.attribution import Attribution
from fusedce_profiler.instrument.step.data import random_batch
from fusedce_profiler.instrument.step.memory import StepMemory
from fusedce_profiler.instrument.step.step import measure_step


@dataclass
class ModelJob:
    """One back-end's training step on one model at one batch size.

    ``memory_limit_bytes`` emulates a smaller card: on CUDA the allocator is capped at the
    limit minus the CUDA context (``set_per_process_memory_fraction``), so "fits" means
    context + reserved ≤ limit, as ``nvidia-smi`` would count it (a step that ran under the
    cap but whose context grew past it, e.g. by lazily loaded kernels, is still ``oom``); on
    the CPU the measured peak is compared with the limit after the step. The context is
    device-wide (``mem_get_info``): other processes' memory on the GPU counts as context, so
    run on an otherwise idle device.
    """

    config: ModelConfig
    backend: str
    batch: int
    seq: int
    device: str = "cuda"
    mode: str = "amp-bf16"
    attention: str = "sdpa"
    checkpointing: bool = False
    eval_step: bool = False
    warmup_steps: int = 1
    memory_limit_bytes: int | None = None
    reduction: str = "mean"
    seed: int = 0
    source: dict | None = None
    trace: bool = True

    def __post_init__(self) -> None:
        for key in ("batch", "seq"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        impls = self.model_source().attention_impls
        if self.attention not in impls:
            raise ValueError(f"attention must be one of {', '.join(impls)}, got {self.attention!r}")
        self.mode = canonical_mode(self.mode, TRAINING_MODES)
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be ≥ 1 (AdamW state must exist), got {self.warmup_steps}")

    def model_source(self) -> ModelSource:
        """Where the model comes from: ``source`` (a :meth:`ModelSource.to_dict`), or the
        built-in GPT of ``config`` when it is ``None``."""
        return source_from_dict(self.source) if self.source else BuiltinSource(self.config)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelJob":
        """A job stored by ``dataclasses.asdict`` (its config validated again)."""
        values = checked_fields(cls, raw, "job")  # the config built and validated again
        if not is_backend_name(values["backend"]):
            raise ValueError(f"job.backend must be a back-end name or 'module:callable', got {values['backend']!r}")
        return cls(**values)

    def key(self) -> str:
        """A stable identifier: two jobs with equal keys are the same measurement (a job holds a
        dict, so it is not hashable itself)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    @property
    def label(self) -> str:
        """The back-end's name as reports show it (``+eval`` when a sanity-check pass ran first)."""
        return self.backend + ("+eval" if self.eval_step else "")


@dataclass
class ModelResult:
    """What one job measured (``memory`` is ``None`` unless ``status == "ok"``).

    ``attribution``: the traced step's peak by module and kind and the logits detector's
    findings (``None`` when not traced); ``head``: the located LM head; ``replaced``: what the
    back-end replaced in the model.
    """

    job: ModelJob
    status: str = "ok"
    message: str = ""
    backend_version: str = ""
    device_name: str = ""
    loss: float | None = None
    time_ms: float | None = None
    memory: StepMemory | None = None
    extra: dict = field(default_factory=dict)
    attribution: Attribution | None = None
    head: HeadInfo | None = None
    replaced: list[Replacement] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def answering(cls, job: ModelJob, raw: object) -> "ModelResult":
        """A training-step job's reply to ``job`` (:meth:`from_dict`); ``ValueError`` for a reply about another job."""
        result = cls.from_dict(raw)
        if result.job != job:
            raise ValueError(f"it is about another job ({result.job.label}, B={result.job.batch}, T={result.job.seq})")
        return result

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelResult":
        """Validate a stored row (:mod:`fusedce_profiler.instrument.schema`); ``ValueError`` naming the field."""
        raw = checked_fields(cls, raw, nested=("job",))  # memory, attribution, head, replaced: built by their types
        raw["job"] = ModelJob.from_dict(raw["job"])
        if raw.get("status", "ok") not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {raw['status']!r}")
        if raw.get("status", "ok") == "ok" and raw.get("memory") is None:  # the writer stores a finished step's
            raise ValueError("status 'ok' without its measurements (memory empty)")
        return cls(**raw)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def memory_fraction(limit: int, context: int, total: int) -> float:
    """The ``set_per_process_memory_fraction`` argument that keeps context + reserved ≤ ``limit``
    on a device of ``total`` bytes (1.0 when the limit is the whole device or more)."""
    if limit <= context:
        raise ValueError(f"memory limit {limit} bytes is below the CUDA context alone ({context} bytes)")
    return min(1.0, (limit - context) / total)


def _cap_cuda_memory(device: torch.device, limit: int) -> None:
    """Cap the allocator so that context + reserved stays under ``limit`` bytes."""
    torch.empty(1, device=device)  # create the context
    # set_per_process_memory_fraction needs an index: torch.device("cuda") has none.
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    context = total - free - torch.cuda.memory_reserved(index)
    torch.cuda.set_per_process_memory_fraction(memory_fraction(limit, context, total), index)


def run_job(job: ModelJob) -> ModelResult:
    """Build the model, warm up and measure one step with ``job.backend``, in this process."""
    device = torch.device(job.device)
    result = ModelResult(job=job)
    try:
        result.device_name = _device_name(device)
        source = job.model_source()
        options = loss_options(source.config, job.reduction)
        resolved = resolve_step_loss(job.backend, source.config, options, device.type, job.batch * job.seq)
        result.backend_version = resolved.version
        if job.memory_limit_bytes is not None and device.type == "cuda":
            _cap_cuda_memory(device, job.memory_limit_bytes)
        torch.manual_seed(job.seed)
        built = source.build(device, attention=job.attention, checkpointing=job.checkpointing, seed=job.seed)
        if job.mode == "bf16":
            built.module.to(torch.bfloat16)
        result.head = built.head.info
        result.replaced = resolved.prepare(built)
        optimizer = torch.optim.AdamW(built.module.parameters(), lr=1e-4)
        input_ids, targets = random_batch(source.config.vocab_size, job.batch, job.seq, device, seed=job.seed)
        outcome = measure_step(built, resolved.step_loss, options, optimizer, input_ids, targets, job.mode,
                               eval_first=job.eval_step, warmup_steps=job.warmup_steps, trace=job.trace,
                               heads=sorted({source.config.num_attention_heads, source.config.kv_heads}))
    except BackendUnavailable as exc:
        result.status, result.message = "skipped", str(exc)
        return result
    except MissingDependency as exc:
        result.status, result.message = "skipped", str(exc)
        return result
    except Exception as exc:  # any back-end failure is a result, with its traceback tail
        if oom.is_out_of_memory(exc):
            result.status, result.message = "oom", (message_of(exc).splitlines() or [type(exc).__name__])[0]
            return result
        result.status = "error"
        named = message_of(exc) if isinstance(exc, FactoryRaised) else f"{type(exc).__name__}: {message_of(exc)}"
        result.message = f"{named}\n" + "".join(traceback.format_exc(limit=4))[-2000:]
        return result
    result.loss, result.time_ms, result.memory = outcome.loss, outcome.time_ms, outcome.memory
    if device.type == "cuda":  # frees-and-retries of the caching allocator near a (capped) limit
        result.extra["num_alloc_retries"] = int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
    result.attribution = outcome.attribution
    limit, m = job.memory_limit_bytes, outcome.memory
    if limit is not None and device.type != "cuda" and m.peak > limit:
        result.status = "oom"
        result.message = f"CPU emulation: peak {m.peak} bytes exceeds the limit {limit} bytes"
    elif limit is not None and m.smi_peak is not None and m.smi_peak > limit:
        result.status = "oom"
        result.message = (f"context {m.context} + peak reserved {m.peak_reserved} bytes exceed the limit {limit} "
                          "bytes (the context grew after the cap was set)")
    return result


def run_jobs(jobs: list[ModelJob]) -> list[ModelResult]:
    """Several jobs one after another in this process (the calibration steps of ``explain``),
    the device's cache emptied between them so each reserved figure is its own."""
    from fusedce_profiler.instrument.protocol import settle

    results = []
    for job in jobs:
        settle(job.device)
        results.append(run_job(job))
        settle(job.device)
    return results


def run_training_jobs(payload: dict) -> list[dict]:
    """The worker's ``training-steps`` job: ``{"jobs": [ModelJob dicts]}`` → their results."""
    return [r.to_dict() for r in run_jobs([ModelJob.from_dict(j) for j in payload["jobs"]])]


def run_training_job(payload: dict) -> dict:
    """The worker's ``training-step`` job: a :class:`ModelJob` as a dict → its result as a dict."""
    return run_job(ModelJob.from_dict(payload)).to_dict()


def run_job_in_worker(job: ModelJob, log_dir: Path, timeout_s: float | None = 900) -> ModelResult:
    """:func:`run_job` in a fresh worker process (:class:`fusedce_profiler.instrument.worker.Worker`).

    A worker that dies without answering (a CUDA error, a kill, a timeout) gives an ``error``
    (or ``timeout``) result naming the cause and its log.
    """
    from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, default_max_rss_bytes, run_stopped_by

    start = time.perf_counter()
    worker = Worker(log_dir)
    try:
        result = worker.call("training-step", dataclasses.asdict(job), timeout_s,
                             max_rss_bytes=default_max_rss_bytes(), read=lambda raw: ModelResult.answering(job, raw))
    except WorkerDied as died:
        if died.at_start:  # no later job could run either (the command line's one line, exit 3)
            raise run_stopped_by(died) from None
        status = "timeout" if died.timed_out else "error"
        what = f"timed out after {timeout_s:g} s" if died.timed_out else died.reason
        log = os.path.relpath(died.log_path, Path(log_dir).parent)  # the run folder's logs/: stored relative
        result = ModelResult(job=job, status=status,
                             message=f"{what}; log {log}" + (f":\n{died.tail}" if died.tail else ""))
    except JobFailed as failed:  # the job raised before it could make its failure a result
        result = ModelResult(job=job, status="error", message=failed.summary_in(Path(log_dir).parent))
    finally:
        worker.close()
    result.extra["wall_s"] = time.perf_counter() - start  # the whole process: start-up, build, warm-up, step
    return result


def append_model_result(folder: Path, result: ModelResult) -> None:
    """Append one result to the folder's ``model_results.jsonl`` (fsync'ed: a killed run loses nothing)."""
    store.append_jsonl(Path(folder) / store.MODEL_RESULTS_FILE, result.to_dict())


def load_model_results(folder: Path) -> store.Loaded[ModelResult]:
    """The rows of a folder's ``model_results.jsonl`` (the store's one reading policy)."""
    return store.read_jsonl(Path(folder) / store.MODEL_RESULTS_FILE, ModelResult.from_dict)
