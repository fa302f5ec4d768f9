"""``doctor`` as a worker job: the user's model factory and loss wrapper run here, in the worker,
never in the process that asked for the verdict.

:func:`run_doctor_job` (the worker's ``doctor`` job kind,
:data:`fusedce_profiler.instrument.worker.JOBS`) loads the ``--loss`` callable, checks that it can
be called with the documented signature, builds the model (calling a ``--model`` factory), and
runs :func:`~fusedce_profiler.judgements.doctor.doctor.run_doctor`. Every way user code can end
is turned into a reply the caller reads, never into the end of the caller:

- ``{"ok": "run", "run": {...}}``: the :class:`~fusedce_profiler.judgements.doctor.records.DoctorRun`;
- ``{"ok": "usage", "message": ...}``: the ``--loss``/``--model`` spec names nothing importable,
  or a callable that cannot be called as documented (exit 2);
- ``{"ok": "user", "callable": spec, "message": ...}``: the factory or the loss raised an exception
  the checks do not take as evidence, or called ``sys.exit`` (any code) (exit 1).

A hang or runaway memory kills the worker; the caller names the callable from the job it sent
(:mod:`fusedce_profile.doctor`). Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the job
joins the process group first (gloo on the CPU, NCCL on GPUs) and the checks run on its rank.

Public API: :func:`run_doctor_job`.
"""
from __future__ import annotations

import os
import traceback

from fusedce_profiler.instrument.callables import what_it_raised


def _join_process_group(device: str) -> None:
    """Join the ``torchrun`` process group the environment describes (once)."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def run_doctor_job(payload: dict) -> dict:
    """The ``doctor`` job (see the module docstring). ``payload``: ``loss`` (spec), ``preset``,
    ``config``, ``hf``, ``model`` (factory spec), ``head``, ``tied``, ``device``, ``mode``, ``batch``,
    ``seq``, ``seed``, ``compile_backend``, ``cpu_limit`` (refuse larger models on the CPU), and, for a
    factory, ``source``: its :meth:`~fusedce_profiler.instrument.models.source.ModelSource.to_dict`, shapes
    and parameter count read before, so that the factory is called here once, to build the model."""
    import torch

    from fusedce_profiler.instrument.models.options import default_preset, source_from_options
    from fusedce_profiler.instrument.models.source import FactoryRaised, source_from_dict
    from fusedce_profiler.judgements.doctor.doctor import cpu_size_guard, load_wrapper, run_doctor, signature_error

    device = payload["device"]
    spec = payload["loss"]
    try:
        fn = load_wrapper(spec)
    except ValueError as exc:
        return {"ok": "usage", "message": str(exc)}
    except BaseException as exc:  # importing the user's module ran user code that failed
        return {"ok": "user", "callable": spec, "message": f"importing it: {what_it_raised(exc)}"}
    reason = signature_error(fn, f"--loss {spec}")
    if reason is not None:
        return {"ok": "usage", "message": reason}
    factory = payload.get("model")
    try:
        _join_process_group(device)
        if payload.get("source") is not None:  # a factory's, its shapes read by the caller's describe worker
            source = source_from_dict(payload["source"])
        else:
            source = source_from_options(payload.get("preset"), payload.get("config"), payload.get("hf"), factory,
                                         payload.get("head"), payload.get("tied"), default_preset(device))
        if not device.startswith("cuda") and payload.get("cpu_limit", True):
            if factory is not None:  # counted when its shapes were read: the factory is not called for it here
                parameters = source.parameters
            else:
                try:
                    on_meta = source.build("meta")
                    parameters = sum(p.numel() for p in {id(p): p for p in on_meta.module.parameters()}.values())
                except Exception:  # noqa: BLE001 - a model that needs real tensors
                    parameters = source.config.num_parameters()
            refused = cpu_size_guard(parameters, source.describe())
            if refused is not None:
                return {"ok": "usage", "message": refused}
        built = source.build(device, seed=payload.get("seed", 0))
    except ValueError as exc:
        if factory is None:
            return {"ok": "usage", "message": str(exc)}
        return {"ok": "user", "callable": f"--model {factory}", "message": what_it_raised(exc)}
    except BaseException as exc:  # the factory's own failure, or its sys.exit
        what = f"--model {factory}" if factory else "the model's build"
        traceback.print_exc()
        raised = exc.__cause__ if isinstance(exc, FactoryRaised) else exc  # the callable is named here already
        return {"ok": "user", "callable": what, "message": what_it_raised(raised)}
    torch.manual_seed(payload.get("seed", 0))
    try:
        run = run_doctor(fn, built, source=source, device=device, mode=payload.get("mode"),
                         batch=payload.get("batch", 4), seq=payload.get("seq", 32), seed=payload.get("seed", 0),
                         spec=spec, compile_backend=payload.get("compile_backend"))
    except BaseException as exc:  # the loss (or the model's forward it calls) ended the run
        traceback.print_exc()
        return {"ok": "user", "callable": f"--loss {spec}", "message": what_it_raised(exc)}
    return {"ok": "run", "run": run.to_dict()}
