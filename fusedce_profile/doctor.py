"""``doctor`` from Python: your loss wrapper checked on your model, in a worker that your code cannot end.

    from fusedce_profile.doctor import doctor

    run = doctor("mypkg.losses:fused_loss", model="mypkg.models:make_model", mode="amp-bf16", out="doctor-run")
    print(run.passed, [(c.key, c.verdict) for c in run.checks])

The keyword arguments mirror ``fusedce-profile doctor``'s options; ``out`` is the run folder, written
as the command writes it (``doctor.json``, ``environment.json``, ``summary.md``, the worker's log
under ``logs/``); the function returns the stored
:class:`~fusedce_profiler.judgements.doctor.records.DoctorRun`.

The loss wrapper and the model factory run in a worker process
(:func:`fusedce_profiler.judgements.doctor.job.run_doctor_job`) with a time limit (``timeout_s``) and
a memory guard (``memory_limit_gb``: the worker is killed when its resident memory grows past it).
An exception the checks do not take as evidence, ``sys.exit`` with any code, a hang or runaway
memory raise :class:`UserCodeFailed`, one line naming the callable (the command exits 1); a spec
that names nothing, or a callable that cannot be called as documented, raises
:class:`~fusedce_profile.errors.UsageError` (exit 2) — both before any verdict, never a pass.
Ctrl-C (``KeyboardInterrupt``) stops the worker, writes ``doctor.json`` marked ``interrupted`` and
re-raises; a stop after the checks finished is taken once they are stored, and
:func:`what_the_stop_left` says what a stopped run's folder holds. Under ``torchrun`` every rank calls it with its own ``out`` (the command appends
``-rankN`` to ranks above 0); the worker joins the process group and checks that rank.

Public API: :func:`doctor`, :func:`check_arguments`, :func:`what_the_stop_left`, :class:`UserCodeFailed`,
:data:`DEFAULT_TIMEOUT_S`, :func:`default_memory_limit_gb`, and :func:`~fusedce_profile.folders.default_out_dir` (re-exported).
"""
from __future__ import annotations

from pathlib import Path

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError
from fusedce_profile.folders import default_out_dir, prepare_out_dir, report_errors

#: How long the worker may take to build the model and run every check.
DEFAULT_TIMEOUT_S = 600.0
_MODES = ("amp-bf16", "fp32")


class UserCodeFailed(RuntimeError):
    """The user's loss wrapper or model factory ended the run (exit 1); ``callable`` names it."""

    def __init__(self, callable_name: str, message: str) -> None:
        super().__init__(f"{callable_name}: {message}")
        self.callable = callable_name


def default_memory_limit_gb() -> float:
    """The worker's memory guard in GiB (:func:`~fusedce_profiler.instrument.worker.default_max_rss_bytes`):
    the worker is stopped before the machine is."""
    from fusedce_profiler.instrument.worker import default_max_rss_bytes

    return default_max_rss_bytes() / 2**30


def check_arguments(loss: str, *, device: str = "cpu", mode: str | None = None, batch: int = 4, seq: int = 32,
                    seed: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, memory_limit_gb: float = 1.0,
                    model_options: tuple = (None, None, None, None, None), tied: bool | None = None) -> None:
    """:class:`~fusedce_profile.errors.UsageError` for arguments :func:`doctor` cannot use (checked
    without importing or running any user code). ``model_options``: (preset, config, hf, model, head)."""
    from fusedce_profile.ranges import check_ranges
    from fusedce_profiler.instrument.models.options import check_model_options

    if not isinstance(loss, str) or ":" not in loss:
        raise UsageError(f"--loss must be 'package.module:callable', got {loss!r}")
    if mode is not None and mode not in _MODES:
        raise UsageError(f"--mode must be amp-bf16 or fp32 for doctor, got {mode!r}")
    arguments.model_options(*model_options)
    if not (arguments.text(device, "--device") == "cpu" or device.startswith("cuda")):
        raise UsageError(f"--device must be cpu, cuda or cuda:K, got {device!r}")
    check_ranges("doctor", batch=batch, seq=seq, seed=seed, timeout=timeout_s, memory_limit=memory_limit_gb)
    arguments.flag(tied, "--tied", optional=True)
    try:
        check_model_options(*model_options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _prepare(out: str | Path | None, force: bool) -> Path:
    """The run folder, as every command prepares it (:func:`~fusedce_profile.folders.prepare_out_dir`):
    created; never a link nor inside another run's folder; a folder holding an earlier run refused
    unless ``force``, which removes that run's files only (and none a live run holds)."""
    return prepare_out_dir(arguments.path(out, "--out"), force=force, resume=False, resume_option=False,
                           kind="doctor")


def _doctor_reply(raw: object):
    """The ``doctor`` job's reply (:mod:`fusedce_profiler.judgements.doctor.job`): the checked
    :class:`~fusedce_profiler.judgements.doctor.records.DoctorRun`, or the refusal to raise
    (:class:`UsageError`, :class:`UserCodeFailed`); ``ValueError`` for a reply of another shape."""
    from fusedce_profiler.judgements.doctor.records import DoctorRun

    kind = raw.get("ok") if isinstance(raw, dict) else None
    if kind == "run":
        return DoctorRun.from_dict(raw["run"])
    if kind == "usage" and isinstance(raw.get("message"), str):
        return UsageError(raw["message"])
    if kind == "user" and isinstance(raw.get("message"), str) and isinstance(raw.get("callable"), str):
        return UserCodeFailed(raw["callable"], raw["message"])
    raise ValueError("neither a checked run nor a refusal")


def _factory_source(model: str, preset, config, head, tied, device: str, timeout_s: float, memory_limit_gb: float,
                    log_dir: Path) -> dict:
    """The ``--model`` factory's source as a dict
    (:meth:`~fusedce_profiler.instrument.models.source.ModelSource.to_dict`), its shapes and
    parameter count read by calling the factory in a worker of its own
    (:func:`~fusedce_profiler.instrument.models.factory.describe_factory`, under ``timeout_s`` and the
    memory limit); a factory that fails there raises :class:`UserCodeFailed`."""
    from fusedce_profile.sources import model_source
    from fusedce_profiler.instrument.models.factory import FactoryFailed
    from fusedce_profiler.instrument.models.options import default_preset

    try:
        source = model_source(preset, config, None, model, head, tied, default_preset(device),
                              factory_timeout=timeout_s, memory_bytes=int(memory_limit_gb * 2**30), log_dir=log_dir)
    except FactoryFailed as failed:
        named = f"--model {model}"
        raise UserCodeFailed(named, str(failed).removeprefix(f"{named}: ")) from None
    return source.to_dict()


def doctor(loss: str, *, preset: str | None = None, config: str | Path | None = None, hf: str | None = None,
           model: str | None = None, head: str | None = None, tied: bool | None = None, device: str | None = None,
           mode: str | None = None, batch: int = 4, seq: int = 32, seed: int = 0, compile_backend: str = "auto",
           timeout_s: float = DEFAULT_TIMEOUT_S, memory_limit_gb: float | None = None,
           out: str | Path | None = None, force: bool = False):
    """Check the loss wrapper ``loss`` (``"package.module:callable"``) on the model the options
    name (``model``: your factory ``"package.module:factory"``; ``hf``; else the built-in
    ``preset``/``config``); write the run folder ``out`` and return its
    :class:`~fusedce_profiler.judgements.doctor.records.DoctorRun`.

    ``mode``: ``amp-bf16`` (bf16 autocast, on the CPU too) or ``fp32``; default ``amp-bf16`` on a
    GPU, ``fp32`` on the CPU. ``compile_backend``: ``auto`` (``inductor`` on a GPU, ``eager`` — dynamo's
    tracing alone — on the CPU), ``none`` (the compile check is skipped) or any ``torch.compile``
    back-end. See the module docstring for what it raises. The returned run's ``folder`` attribute
    (not stored) is the folder written — a new ``./fusedce-profile-…`` one when ``out`` is ``None``.
    """
    import torch

    from fusedce_profiler.instrument import staging, store
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.instrument.worker import Worker, WorkerDied, run_stopped_by
    from fusedce_profiler.judgements.doctor.records import DoctorRun
    from fusedce_reports.doctor_report import write_doctor_report

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    memory_limit_gb = default_memory_limit_gb() if memory_limit_gb is None else memory_limit_gb
    check_arguments(loss, device=device, mode=mode, batch=batch, seq=seq, seed=seed, timeout_s=timeout_s,
                    memory_limit_gb=memory_limit_gb, model_options=(preset, str(config) if config else None, hf, model,
                                                                    head), tied=tied)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is visible; use --device cpu")
    backend = compile_backend
    if backend == "auto":
        backend = "inductor" if device.startswith("cuda") else "eager"
    folder = _prepare(out, force)
    save_environment(folder, collect_environment())
    payload = {"loss": loss, "preset": preset, "config": str(config) if config else None, "hf": hf, "model": model,
               "head": head, "tied": tied, "device": device, "mode": mode, "batch": batch, "seq": seq, "seed": seed,
               "compile_backend": None if backend == "none" else backend}
    worker = None
    try:
        if model:  # its shapes read in a worker of their own: the doctor's worker calls the factory once
            payload["source"] = _factory_source(model, preset, config, head, tied, device, timeout_s,
                                                memory_limit_gb, folder / store.LOGS_DIR)
        worker = Worker(folder / store.LOGS_DIR, preload=("doctor",))  # its imports before the time limit starts
        reply = worker.call("doctor", payload, timeout_s=timeout_s, max_rss_bytes=int(memory_limit_gb * 2**30),
                            read=_doctor_reply)
    except WorkerDied as exc:
        if exc.at_start:  # before the loss or the factory ran: the command line's one line, exit 3
            raise run_stopped_by(exc) from None
        culprit = f"--model {model}" if model else f"--loss {loss}"
        what = f"--loss {loss} (or {culprit})" if model else culprit
        if exc.timed_out:
            raise UserCodeFailed(what, f"did not finish within {timeout_s:g} s (a hang?); the worker was stopped; "
                                       f"log {exc.log_path}") from None
        if exc.over_memory:
            raise UserCodeFailed(what, f"grew past the memory limit of {memory_limit_gb:.3g} GiB; the worker was "
                                       f"stopped; log {exc.log_path}") from None
        raise UserCodeFailed(what, exc.summary) from None
    except KeyboardInterrupt:
        if worker is not None:
            worker.close()
        partial = DoctorRun(loss=loss, config=model or hf or str(config or preset or ""), checks=[], device=device,
                            mode=mode or "", batch=batch, seq=seq, interrupted=True)
        with staging.signals_held():  # a second signal cuts neither doctor.json nor its page
            store.write_json(folder / store.DOCTOR_FILE, partial.to_dict())
            write_doctor_report(folder)
        raise
    finally:
        if worker is not None:
            worker.close()
    if isinstance(reply, Exception):
        raise reply
    run = reply
    with staging.signals_held():  # the finished checks are stored whole; a signal now is taken after them
        store.write_json(folder / store.DOCTOR_FILE, run.to_dict())
        with report_errors(folder, "the checks"):  # a full disk at the page: the verdict is kept, and said so
            write_doctor_report(folder)
    run.folder = str(folder)
    return run


def what_the_stop_left(folder: Path, stopped: KeyboardInterrupt) -> str:
    """The line a stopped doctor prints: what its folder holds (every check, a partial report, or
    nothing yet) and what to do."""
    from fusedce_profile.signals import signal_name
    from fusedce_profiler.instrument.confined import FolderRefused
    from fusedce_reports.doctor_report import read_doctor

    try:
        stored = read_doctor(folder)
    except (OSError, ValueError, FolderRefused):
        stored = None
    if stored is not None and not stored.interrupted:
        return (f"stopped by {signal_name(stopped)} after every check finished: {'PASS' if stored.passed else 'FAIL'}; "
                f"report: {folder / 'summary.md'}")
    if stored is not None:
        return f"interrupted; partial report (no verdict) in {folder}; run the same command with --force"
    return f"interrupted before any check ran; nothing to report in {folder}; run the same command with --force"
