"""``fusedce-profile model`` as a Python function: one training step of a model per loss back-end,
measured, and where each peak goes.

>>> from fusedce_profile.model import profile_model
>>> results = profile_model(preset="tiny", backend=["torch", "fusedce"], batch=2, seq=32, device="cpu",
...                         trace=False, out="model-run")
>>> [(r.job.backend, r.status, r.memory.peak) for r in results]

Keyword arguments mirror the command's options (``model`` for ``--model package.module:factory``);
``out`` is the run folder, written as the command writes it (``model_results.jsonl``,
``environment.json``, ``summary.md``, ``plots/``, ``logs/``, ``fit.json`` with ``fit``). Returns the
stored :class:`~fusedce_profiler.instrument.step.jobs.ModelResult` rows. Each job runs in a fresh worker
process and its row is stored as soon as it finishes: Ctrl-C (``KeyboardInterrupt``) keeps the
finished rows, writes the report of them marked *interrupted*, and propagates; ``resume=True`` with
the same ``out`` measures only the jobs still missing. A user's factory is called in a worker with a
time limit (``factory_timeout``) and a memory guard; one that fails raises
:class:`~fusedce_profiler.instrument.models.factory.FactoryFailed` in one line naming it.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from fusedce_profile import arguments, exit_codes
from fusedce_profile.errors import UsageError
from fusedce_profile.outcome import CommandOutcome
from fusedce_profiler.instrument.text import count, one_line, same_command_resumed


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What :func:`plan_model` settled: the model source, the first job (the others are its
    variants), the jobs, the back-ends named explicitly (``None``: the defaults), and the ``fit``
    search (limit in GiB or ``None``, axis, largest value)."""

    source: object
    base: object
    jobs: tuple
    named: tuple[str, ...] | None
    fit: float | None
    fit_axis: str
    fit_max: int


def plan_model(*, preset=None, config=None, tied=None, hf=None, model=None, head=None, trace=True, batch=None,
               seq=None, backend: Sequence[str] | None = None, attention="sdpa", checkpointing=False,
               eval_step=False, fit=None, fit_axis="batch", fit_max=1024, seed=0, device=None, mode=None,
               factory_timeout: float | None = None) -> ModelPlan:
    """Check :func:`profile_model`'s arguments and settle its jobs; bad input raises
    :class:`~fusedce_profile.errors.UsageError` (nothing is measured or written)."""
    from fusedce_profile.checks import check_backends, check_model_fits, resolve_device
    from fusedce_profile.defaults import installed_backends
    from fusedce_profile.ranges import check_ranges
    from fusedce_profile.sources import backend_names, default_preset, loss_backends, model_source
    from fusedce_profiler.instrument.step.jobs import ModelJob
    from fusedce_profiler.judgements.fit import FIT_AXES

    world = os.environ.get("WORLD_SIZE", "1")
    if world.strip() not in ("", "0", "1"):  # a launcher's ranks would each measure every job into one folder
        raise UsageError(f"model runs in one process, and WORLD_SIZE={world!r} says this is one rank of several "
                         "(torchrun): run it without a launcher; `doctor` checks a distributed run rank by rank")

    check_ranges("model", batch=batch, seq=seq, fit=fit, fit_max=fit_max, seed=seed, factory_timeout=factory_timeout)
    for value, option in ((trace, "--trace"), (checkpointing, "--checkpointing"), (eval_step, "--eval-step")):
        arguments.flag(value, option)
    arguments.flag(tied, "--tied", optional=True)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    source = model_source(preset, config, hf, model, head, tied, default_preset(run_device),
                          factory_timeout=factory_timeout)
    if fit_axis not in FIT_AXES:
        raise UsageError(f"--fit-axis must be one of {', '.join(FIT_AXES)}, got {fit_axis!r}")
    named = backend_names(backend)
    names = loss_backends(named, installed_backends(run_device))
    try:
        base = ModelJob(source.config, "torch", batch or (8 if on_gpu else 4), seq or (1024 if on_gpu else 64),
                        device=run_device, mode=mode or "amp-bf16", attention=attention, checkpointing=checkpointing,
                        seed=seed, source=None if source.kind == "builtin" else source.to_dict(), trace=trace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_backends(names)
    check_model_fits(source.config, run_device, base.batch, base.seq, parameters=source.parameters)
    jobs = [dataclasses.replace(base, backend=name) for name in names]
    if eval_step:
        jobs += [dataclasses.replace(job, eval_step=True) for job in jobs]
    return ModelPlan(source, base, tuple(jobs), tuple(named) if named else None, fit, fit_axis, fit_max)


def _job_line(job, result, out_dir: Path) -> str:
    """The progress line of one finished job (a worker's log named from where the command runs)."""
    from fusedce_profiler.instrument.worker_errors import line_naming_log
    from fusedce_reports.units import format_bytes, format_percent

    m = result.memory
    detail = (f"peak {format_bytes(m.peak)} ({m.peak_phase}), loss region {format_bytes(m.loss_extra)} "
              f"= {format_percent(m.loss_share)} of the peak" if m else f"{result.status}: "
              f"{line_naming_log(result.message, out_dir, 120)}")
    if result.attribution is not None:
        from fusedce_profiler.instrument.tracing.attribution import logits_verdict

        detail += f"; logits: {logits_verdict(result.attribution, naive=job.backend == 'torch')[0]}"
    wall = result.extra.get("wall_s")
    return f"  {job.label}: {detail}" + (f" [{wall:.0f} s]" if wall is not None else "")


def _summary_row(job, result) -> dict:
    from fusedce_reports.model_report import logits_status

    m = result.memory
    return {"backend": job.label, "status": result.status, "peak_bytes": m.peak if m else None,
            "loss_bytes": m.loss_extra if m else None, "smi_peak_bytes": m.smi_peak if m else None,
            "logits": (logits_status(result) if result.attribution is not None else None)}


def failed_named_backends(plan: ModelPlan, results: list) -> list[str]:
    """The back-ends named explicitly whose every job failed (error, timeout or skipped)."""
    from fusedce_profile.checks import nothing_measured

    failed = []
    for name in plan.named or ():
        statuses = [r.status for r in results if r.job.backend == name]
        if nothing_measured(statuses):
            failed.append(name)
    return failed


def _run_jobs(plan: ModelPlan, out_dir: Path, done: dict, say) -> dict:
    """Run the jobs not in ``done`` (job -> stored result), storing each row as it finishes; returns
    the plain (not ``+eval``) result of every back-end, for ``fit``."""
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.step.jobs import append_model_result, run_job_in_worker

    measured = {}
    for job in plan.jobs:
        result = done.get(job.key())
        if result is None:
            result = run_job_in_worker(job, out_dir / store.LOGS_DIR)
            append_model_result(out_dir, result)
        if not job.eval_step:
            measured[job.backend] = result
        say(_job_line(job, result, out_dir))
    return measured


def model_command(*, out: str | Path | None = None, force: bool = False, resume: bool = False,
                  console: Console | None = None, **options) -> CommandOutcome:
    """``fusedce-profile model``: :func:`profile_model` with the exit code and ``--json`` summary the
    command line needs (a signal ends it with :attr:`CommandOutcome.stopped` set, not raised)."""
    plan = plan_model(**options)  # bad input refused before torch and matplotlib are imported
    arguments.console(console)
    from fusedce_profile.checks import nothing_measured
    from fusedce_profile.folders import check_appendable, os_errors, report_errors, run_folder
    from fusedce_profile.interruption import interrupted_outcome, report_stopped
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.interruption import clear_interruption
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.instrument.step.jobs import load_model_results
    from fusedce_profiler.instrument.step.plan import save_model_plan
    from fusedce_profiler.judgements.fit import FitResult, fit_backends
    from fusedce_reports.model_report import write_model_report
    from fusedce_reports.units import GIB, format_bytes

    console = console or Console(quiet=True)

    def say(line: str) -> None:
        console.print(line, markup=False)

    base = plan.base
    with run_folder(arguments.path(out, "--out"), force=force, resume=resume, kind="model") as out_dir:
        say(f"fusedce-profile model: {one_line(plan.source.describe())} "
            f"({plan.source.parameters / 1e6:.1f} M parameters), "
            f"B={base.batch} T={base.seq}, {base.mode}, {base.device}; writing to {one_line(out_dir)}")
        done = {r.job.key(): r for r in load_model_results(out_dir).records} if resume else {}
        if resume:
            _check_same_plan(out_dir, plan.jobs, set(done))
            with os_errors():
                check_appendable(out_dir / store.MODEL_RESULTS_FILE)  # before the plan is replaced
        save_model_plan(out_dir, plan.jobs)
        clear_interruption(out_dir)
        if not done or not (out_dir / store.ENVIRONMENT_FILE).is_file():
            save_environment(out_dir, collect_environment())
        fits = []
        try:
            measured = _run_jobs(plan, out_dir, done, say)
            if plan.fit is not None:
                def show_fit(found: FitResult) -> None:
                    probes = ", ".join(f"{n}:{'fits' if ok else 'no'}" for n, ok in found.search.probes)
                    say(f"  fit {format_bytes(found.limit_bytes)}: {found.backend}: largest {found.axis} = "
                        f"{found.search.largest} (probes {probes})")

                names = [job.backend for job in plan.jobs if not job.eval_step]
                fits = fit_backends(base, names, measured, plan.fit_axis, int(plan.fit * GIB), plan.fit_max,
                                    runner=lambda job: _fit_probe(job, out_dir), folder=out_dir, progress=show_fit)
        except KeyboardInterrupt as stopped:
            results = list(load_model_results(out_dir).records)
            return interrupted_outcome(out_dir, stopped, results, f"{len(results)} of {len(plan.jobs)} jobs",
                                       same_command_resumed(out_dir), write_model_report, say)
        try:
            with report_errors(out_dir, "the finished jobs"):
                report_path = write_model_report(out_dir)
        except KeyboardInterrupt as stopped:
            results = list(load_model_results(out_dir).records)
            return report_stopped(out_dir, stopped, results, count(len(results), "job"), say)
        say(f"report: {one_line(report_path)}")
        results = list(load_model_results(out_dir).records)
    latest = {r.job.key(): r for r in results}  # a job's row is the last one stored for it
    summary = {"out": str(out_dir), "results": [_summary_row(job, latest[job.key()]) for job in plan.jobs
                                                if job.key() in latest],
               "fit": [{"backend": f.backend, "axis": f.axis, "largest": f.search.largest} for f in fits]}
    code = exit_codes.OK
    if nothing_measured([row["status"] for row in summary["results"]]):
        say("every job failed (see the lines above and logs/): exit code 1")
        code = exit_codes.CHECK_FAILED
    else:
        for name in failed_named_backends(plan, results):
            say(f"{name} failed in every job (see the lines above and logs/): exit code 1")
            code = exit_codes.CHECK_FAILED
    return CommandOutcome(results, code, summary)


def _check_same_plan(out_dir: Path, jobs: list, finished: set[str]) -> None:
    """``UsageError`` when ``--resume`` would drop jobs the folder's run set out to measure
    (``model_plan.json``) and has not finished: a resume given other options would measure other
    jobs into that folder and leave the first run unfinished. Adding jobs, or leaving out finished
    ones, is allowed."""
    from fusedce_profiler.instrument.planned import dropped_unfinished
    from fusedce_profiler.instrument.step.plan import planned_jobs

    try:
        stored = planned_jobs(out_dir)
    except ValueError as exc:  # what the first run set out to measure is unknown: replaced only when asked
        raise UsageError(f"--resume: {one_line(exc)}; remove that file to resume with this command's jobs") from None
    dropped = dropped_unfinished(stored, jobs, finished)
    if dropped:
        job = dropped[0]
        raise UsageError(f"--resume: {one_line(out_dir)} holds a run planned with other jobs ({len(dropped)} "
                         f"unfinished of its {len(stored)} are not in this command's, e.g. {job.label} at "
                         f"B={job.batch} T={job.seq}, {job.mode}); give the options of the command that started it")


def _fit_probe(job, out_dir: Path):
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.step.jobs import run_job_in_worker

    return run_job_in_worker(job, out_dir / store.LOGS_DIR)


def profile_model(*, preset: str | None = None, config: str | Path | None = None, tied: bool | None = None,
                  hf: str | None = None, model: str | None = None, head: str | None = None, trace: bool = True,
                  batch: int | None = None, seq: int | None = None, backend: Sequence[str] | None = None,
                  attention: str = "sdpa", checkpointing: bool = False, eval_step: bool = False,
                  fit: float | None = None, fit_axis: str = "batch", fit_max: int = 1024, seed: int = 0,
                  device: str | None = None, mode: str | None = None, factory_timeout: float | None = None,
                  out: str | Path | None = None, force: bool = False, resume: bool = False,
                  console: Console | None = None) -> list:
    """Measure one training step of a model per loss back-end into ``out`` (``fusedce-profile model``);
    returns the stored model results (see the module docstring).

    The model: ``preset`` / ``config`` (the built-in GPT; default ``tiny`` on the CPU, ``user-gpt`` on
    a GPU), ``hf`` (a Hugging Face config, random weights) or ``model`` (``package.module:factory``,
    given the preset/config when it takes an argument). ``fit``: GiB; find per back-end the largest
    ``fit_axis`` (``batch`` or ``seq``, up to ``fit_max``) that trains under it.
    """
    return model_command(preset=preset, config=config, tied=tied, hf=hf, model=model, head=head, trace=trace,
                         batch=batch, seq=seq, backend=backend, attention=attention, checkpointing=checkpointing,
                         eval_step=eval_step, fit=fit, fit_axis=fit_axis, fit_max=fit_max, seed=seed, device=device,
                         mode=mode, factory_timeout=factory_timeout, out=out, force=force, resume=resume,
                         console=console).records_or_raise()
