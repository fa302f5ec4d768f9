"""The user's model factory (``--model package.module:factory``), called in a box.

The factory is the user's code: it may raise, call ``sys.exit``, hang or allocate without
bound. :func:`describe_factory` calls it in a worker process
(:class:`~fusedce_profiler.instrument.worker.Worker`) under a time limit and a memory guard
(the worker's address space is capped at what it maps after start-up plus ``memory_bytes``), and
returns what the commands need before anything is measured: the model's shapes (V and H from
its located head, layers and heads from the module tree) and its real parameter count, counted
from the module the factory built (shared parameters once). Whatever goes wrong becomes
:class:`FactoryFailed`, one line naming the callable; ``bad_signature`` when it cannot be imported or called
as ``factory()`` or ``factory(config)`` (the documented signatures) or returns no ``nn.Module``.
"""
from __future__ import annotations

import os
from pathlib import Path

from fusedce_profiler.instrument.callables import CallableFailed, message_of
from fusedce_profiler.instrument.models.configs import ModelConfig
from fusedce_profiler.instrument.scratch import scratch_folder

FACTORY_TIMEOUT_S = 300.0
"""Default time limit of one factory call, in seconds: a model is built in seconds; a minute-long
build is a large model on the CPU."""


class FactoryFailed(CallableFailed):
    """The factory could not give a model; the message is one line naming the callable.
    ``bad_signature``: it cannot be called with the documented signature (or returned no module)."""

    def __init__(self, message: str, *, bad_signature: bool = False) -> None:
        super().__init__(message)
        self.bad_signature = bad_signature


def physical_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_memory_guard_bytes() -> int:
    """Half the machine's physical memory: a factory that allocates more is stopped before the
    machine swaps."""
    return physical_memory_bytes() // 2


def _mapped_bytes() -> int:
    """This process's virtual size now (``VmSize``, Linux); 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _guard_memory(memory_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus ``memory_bytes``: an allocation
    past it fails (``MemoryError`` / a failed torch allocation) instead of growing without bound."""
    import resource

    limit = _mapped_bytes() + int(memory_bytes)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def describe_job(payload: dict) -> dict:
    """Worker side of :func:`describe_factory`: call the factory once (on the meta device when it
    allows, else on the CPU) and describe the module; every failure, ``SystemExit`` included, is an
    answer, never a dead worker."""
    from fusedce_profiler.instrument.callables import load_callable
    from fusedce_profiler.instrument.models.source import FactoryRaised, UserSource

    target = payload["target"]
    if payload.get("memory_bytes"):
        _guard_memory(payload["memory_bytes"])
    given = ModelConfig(**payload["given"]) if payload.get("given") else None
    over_guard = (f"allocated more than the memory guard ({payload['memory_bytes'] / 2**30:.1f} GiB) allows"
                  if payload.get("memory_bytes") else None)
    try:
        load_callable(target, "--model")  # importable and callable: else a usage error, as for --backend
        source = UserSource(target, given, head_path=payload.get("head"))
    except FactoryRaised as exc:  # the factory's own end, named in the message (the exception is the cause)
        if isinstance(exc.__cause__, MemoryError) and over_guard:
            return {"ok": False, "message": _memory_error(target, over_guard, exc.__cause__)}
        if over_guard and ("DefaultCPUAllocator" in str(exc) or "out of memory" in str(exc).lower()):
            return {"ok": False, "message": f"--model {target}: the factory {over_guard}"}
        return {"ok": False, "message": str(exc)}
    except ValueError as exc:  # the tool's: the import, the factory's signature or return, its head not found
        return {"ok": False, "message": str(exc).splitlines()[0], "bad_signature": True}
    except SystemExit as exc:
        return {"ok": False, "message": f"--model {target}: the factory called sys.exit({exc.code!r})"}
    except MemoryError as exc:
        return {"ok": False, "message": _memory_error(target, over_guard, exc)}
    except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is one line
        lines = message_of(exc).strip().splitlines()
        first = lines[0][:300] if lines else ""
        if over_guard and ("DefaultCPUAllocator" in first or "out of memory" in first.lower()):
            first = f"it {over_guard}"
        return {"ok": False, "message": f"--model {target}: the factory raised {type(exc).__name__}: {first}"}
    return {"ok": True, "config": source.config.to_dict(), "parameters": source.parameters}


def _memory_error(target: str, over_guard: str | None, exc: MemoryError) -> str:
    """The factory's ``MemoryError`` in one line. An allocation past the guard fails with one; so
    does a factory that raises it itself: a bare one is an allocation's, one with a message may be
    either, and the line says both (run the factory alone, without the guard, to tell them apart)."""
    said = message_of(exc).strip().splitlines()
    if not over_guard:
        return f"--model {target}: the factory raised MemoryError" + (f": {said[0][:300]}" if said else "")
    if not said:
        return f"--model {target}: the factory {over_guard}"
    return (f"--model {target}: the factory raised MemoryError: {said[0][:300]} — it {over_guard}, "
            "or raised it itself")


def _described(raw: object) -> tuple[ModelConfig, int] | FactoryFailed:
    """The ``describe-model`` job's reply (:func:`describe_job`): (shapes, parameter count), or the
    failure to raise; ``ValueError`` for a reply of another shape."""
    from fusedce_profiler.instrument.schema import build

    if not isinstance(raw, dict) or not isinstance(raw.get("ok"), bool):
        raise ValueError("neither a description nor a failure")
    if not raw["ok"]:
        if not isinstance(raw.get("message"), str):
            raise ValueError("a failure without a message")
        return FactoryFailed(raw["message"], bad_signature=raw.get("bad_signature") is True)
    parameters = raw.get("parameters")
    if not isinstance(parameters, int) or isinstance(parameters, bool) or parameters < 0:
        raise ValueError(f"parameters must be a count, got {parameters!r}")
    return build(ModelConfig, raw.get("config")), parameters


def describe_factory(target: str, given: ModelConfig | None, head_path: str | None, *,
                     timeout_s: float = FACTORY_TIMEOUT_S, memory_bytes: int | None = None,
                     log_dir: Path | None = None) -> tuple[ModelConfig, int]:
    """(shapes, parameter count) of the model ``target`` builds, the factory called in a worker
    (see the module docstring); :class:`FactoryFailed` when it cannot give one. ``log_dir``: where
    the worker's log goes (default: a temporary folder, removed after)."""
    from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, run_stopped_by

    memory = default_memory_guard_bytes() if memory_bytes is None else memory_bytes
    payload = {"target": target, "given": given.to_dict() if given else None, "head": head_path,
               "memory_bytes": memory}
    with scratch_folder("factory") as scratch:  # a kill -9 leaves it to the next one
        # its imports (torch) before the clock starts: the time limit is the factory's own
        worker = Worker(Path(log_dir) if log_dir is not None else Path(scratch), preload=("describe-model",))
        try:
            reply = worker.call("describe-model", payload, timeout_s, read=_described)
        except WorkerDied as died:
            if died.at_start:  # before the factory was called: no fault of it (exit 3)
                raise run_stopped_by(died, log_kept=log_dir is not None) from None
            if died.timed_out:
                raise FactoryFailed(f"--model {target}: the factory did not return within {timeout_s:g} s") from None
            raise FactoryFailed(f"--model {target}: the worker building the model died ({died.reason})") from None
        except JobFailed as failed:
            raise FactoryFailed(f"--model {target}: describing the model failed in its worker: {failed.cause}") from None
        finally:
            worker.close()
    if isinstance(reply, FactoryFailed):
        raise reply
    return reply
