"""``model``: one training step of a model per loss back-end, measured; the report folder is
written by :mod:`fusedce_reports.model_report`. Exit codes (:mod:`fusedce_profile.exit_codes`): 0 ok, 1 every job
failed, 2 bad usage or input."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Optional

import typer

from fusedce_cli import exit_codes
from fusedce_profile.checks import check_backends, check_model_fits, nothing_measured
from fusedce_profile.console import make_console
from fusedce_cli.model_options import (BackendOption, ConfigOption, HFOption, HeadOption, ModeOption, PresetOption,
                               SeedOption, TiedOption, UserModelOption, default_preset, loss_backends, model_source)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from fusedce_cli.usage import fail, usage_errors
from fusedce_profiler.instrument.text import shorten

TraceOption = Annotated[bool, typer.Option(
    "--trace/--no-trace", help="Attribute each back-end's peak by module and kind and run the logits detector "
                               "(one more, profiled training step).")]


def model(
    preset: PresetOption = None,
    config: ConfigOption = None,
    tied: TiedOption = None,
    hf: HFOption = None,
    user_model: UserModelOption = None,
    head: HeadOption = None,
    trace: TraceOption = True,
    batch: Annotated[Optional[int], typer.Option(help="Batch size B (default 8 on a GPU, 4 on the CPU).", min=1)] = None,
    seq: Annotated[Optional[int], typer.Option(help="Sequence length T (default 1024 on a GPU, 64 on the CPU).",
                                               min=1)] = None,
    backend: BackendOption = None,
    attention: Annotated[str, typer.Option(help="sdpa, or eager (B×heads×T×T scores materialised); Hugging Face "
                                                "models also take what transformers supports (flex_attention, "
                                                "flash_attention_2).")] = "sdpa",
    checkpointing: Annotated[bool, typer.Option(
        "--checkpointing", help="Activation checkpointing: per block (built-in), gradient_checkpointing_enable() "
                                "(Hugging Face, your model).")] = False,
    eval_step: Annotated[bool, typer.Option(
        "--eval-step", help="Also run each back-end after an evaluation pass that materialises full logits "
                            "(Lightning's sanity check), to show what it leaves reserved.")] = False,
    fit: Annotated[Optional[float], typer.Option(
        help="GiB: find the largest size that trains under this limit (context included) per back-end.")] = None,
    fit_axis: Annotated[str, typer.Option(help="What --fit grows: batch or seq.")] = "batch",
    fit_max: Annotated[int, typer.Option(help="Largest value --fit tries.", min=1)] = 1024,
    seed: SeedOption = 0,
    device: DeviceOption = None,
    mode: ModeOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Measure one training step of a model per loss back-end: where the peak goes, what each saves."""
    from fusedce_profile.defaults import installed_backends
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.judgements.fit import FIT_AXES, FitResult, fit_backends
    from fusedce_profiler.instrument.step.jobs import ModelJob, append_model_result, run_job_in_worker
    from fusedce_reports.model_report import logits_status, write_model_report
    from fusedce_reports.units import GIB, format_bytes, format_percent

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    source = model_source(preset, config, hf, user_model, head, tied, default_preset(run_device))
    cfg = source.config
    if fit_axis not in FIT_AXES:
        raise fail(f"--fit-axis must be one of {', '.join(FIT_AXES)}, got {fit_axis!r}")
    if fit is not None and fit <= 0:
        raise fail(f"--fit must be a positive number of GiB, got {fit}")
    names = loss_backends(backend, installed_backends(run_device))
    with usage_errors():
        base = ModelJob(cfg, "torch", batch or (8 if on_gpu else 4), seq or (1024 if on_gpu else 64),
                        device=run_device, mode=mode or "amp-bf16", attention=attention, checkpointing=checkpointing,
                        seed=seed, source=None if source.kind == "builtin" else source.to_dict(), trace=trace)
        check_backends(names)
        check_model_fits(cfg, run_device, base.batch, base.seq)
    out_dir = prepare_out(out, force)
    console.print(f"fusedce-profile model: {source.describe()} ({cfg.num_parameters() / 1e6:.1f} M parameters), "
                  f"B={base.batch} T={base.seq}, {base.mode}, {run_device}; writing to {out_dir}", markup=False)
    save_environment(out_dir, collect_environment())
    logs = out_dir / store.LOGS_DIR

    def run_in_worker(job: ModelJob):
        return run_job_in_worker(job, logs)

    jobs = [dataclasses.replace(base, backend=name) for name in names]
    if eval_step:
        jobs += [dataclasses.replace(job, eval_step=True) for job in jobs]
    summary, measured = [], {}
    for job in jobs:
        result = run_in_worker(job)
        if not job.eval_step:
            measured[job.backend] = result
        append_model_result(out_dir, result)
        m = result.memory
        detail = (f"peak {format_bytes(m.peak)} ({m.peak_phase}), loss region {format_bytes(m.loss_extra)} "
                  f"= {format_percent(m.loss_share)} of the peak" if m else f"{result.status}: "
                  f"{shorten(result.message, 120)}")
        if result.attribution is not None:
            from fusedce_profiler.instrument.tracing.attribution import logits_verdict

            detail += f"; logits: {logits_verdict(result.attribution, naive=job.backend == 'torch')[0]}"
        wall = result.extra.get("wall_s")
        console.print(f"  {job.label}: {detail}" + (f" [{wall:.0f} s]" if wall is not None else ""), markup=False)
        summary.append({"backend": job.label, "status": result.status, "peak_bytes": m.peak if m else None,
                        "loss_bytes": m.loss_extra if m else None, "smi_peak_bytes": m.smi_peak if m else None,
                        "logits": (logits_status(result) if result.attribution is not None else None)})
    fits = []
    if fit is not None:
        def show_fit(found: FitResult) -> None:
            probes = ", ".join(f"{n}:{'fits' if ok else 'no'}" for n, ok in found.search.probes)
            console.print(f"  fit {format_bytes(found.limit_bytes)}: {found.backend}: largest {found.axis} = "
                          f"{found.search.largest} (probes {probes})", markup=False)

        fits = fit_backends(base, names, measured, fit_axis, int(fit * GIB), fit_max, runner=run_in_worker,
                            folder=out_dir, progress=show_fit)
    report_path = write_model_report(out_dir)
    console.print(f"report: {report_path}", markup=False)
    if as_json:
        print(json.dumps({"out": str(out_dir), "results": summary,
                          "fit": [{"backend": f.backend, "axis": f.axis, "largest": f.search.largest} for f in fits]}))
    if nothing_measured([row["status"] for row in summary]):
        console.print("every job failed (see the lines above and logs/): exit code 1", markup=False)
        raise typer.Exit(exit_codes.CHECK_FAILED)
