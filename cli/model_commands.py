"""``model``, ``parity`` and ``doctor``: a whole training step, not just the loss.

The functions are typer-annotated; :mod:`cli.app` registers them as sub-commands. Each
writes its report folder through :mod:`reports` (:mod:`~reports.model_report`,
:mod:`~reports.parity_report`, :mod:`~reports.doctor_report`). Exit codes as everywhere
(:mod:`cli.exit_codes`): 0 ok, 1 a parity or doctor check failed, 2 bad usage or input.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import exit_codes
from cli.checks import check_backends, check_loss_wrapper, check_model_fits, nothing_measured
from cli.console import make_console
from cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from cli.parsing import parse_backends
from cli.usage import fail, usage_errors
from profiler.configs import ModelConfig, get_preset, load_config
from profiler.text import shorten

GIB = 1 << 30

PresetOption = Annotated[Optional[str], typer.Option(
    "--preset", help="A built-in model (see `presets`); default user-gpt on a GPU, tiny on the CPU.")]
ConfigOption = Annotated[Optional[Path], typer.Option(
    "--config", help="A Hugging Face config.json, or our JSON/TOML (hidden_size, ffn_factor, ...).")]
TiedOption = Annotated[Optional[bool], typer.Option(
    "--tied/--untied", help="Override the config's tie_word_embeddings.")]
ModeOption = Annotated[Optional[str], typer.Option(
    "--mode", help="amp-bf16 (fp32 weights, bf16 autocast) or fp32. Default amp-bf16 (parity on CPU: fp32).")]
SeedOption = Annotated[int, typer.Option(
    help="Seed of the model's initialisation and of the data (a second seed repeats a comparison on "
         "another trajectory).", min=0)]
BackendOption = Annotated[Optional[list[str]], typer.Option(
    "--backend", metavar="NAME", help="Loss back-end (repeatable): torch, torch-compile, torch-native, fusedce, liger, cce, "
                      "or module:callable with the back-end signature (hidden, weight, target, bias, **options).")]


def _config(preset: Optional[str], config: Optional[Path], tied: Optional[bool], default: str) -> ModelConfig:
    if preset and config:
        raise fail("--preset and --config both name a model: give one of them")
    with usage_errors():
        model = load_config(config) if config else get_preset(preset or default)
    return model if tied is None else dataclasses.replace(model, tie_word_embeddings=tied)


def _backends(backend: Optional[list[str]], default: list[str]) -> list[str]:
    from profiler.backends import BUILTIN_BACKENDS

    names = parse_backends(backend, list(BUILTIN_BACKENDS)) or default
    return ["torch"] + [b for b in names if b != "torch"]  # torch first: the reference


def model(
    preset: PresetOption = None,
    config: ConfigOption = None,
    tied: TiedOption = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch size B (default 8 on a GPU, 4 on the CPU).", min=1)] = None,
    seq: Annotated[Optional[int], typer.Option(help="Sequence length T (default 1024 on a GPU, 64 on the CPU).",
                                               min=1)] = None,
    backend: BackendOption = None,
    attention: Annotated[str, typer.Option(help="sdpa, or eager (B×heads×T×T scores materialised).")] = "sdpa",
    checkpointing: Annotated[bool, typer.Option("--checkpointing", help="Activation checkpointing per block.")] = False,
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
    from cli.defaults import installed_backends
    from profiler import store
    from profiler.environment import collect_environment, save_environment
    from profiler.training.fit import FIT_AXES, fit_backend, predicted_start, save_fits
    from profiler.training.jobs import ModelJob, append_model_result, run_job_in_worker
    from reports.model_report import write_model_report
    from reports.units import format_bytes, format_percent

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    cfg = _config(preset, config, tied, "user-gpt" if on_gpu else "tiny")
    if fit_axis not in FIT_AXES:
        raise fail(f"--fit-axis must be one of {', '.join(FIT_AXES)}, got {fit_axis!r}")
    if fit is not None and fit <= 0:
        raise fail(f"--fit must be a positive number of GiB, got {fit}")
    names = _backends(backend, installed_backends(run_device))
    with usage_errors():
        base = ModelJob(cfg, "torch", batch or (8 if on_gpu else 4), seq or (1024 if on_gpu else 64),
                        device=run_device, mode=mode or "amp-bf16", attention=attention, checkpointing=checkpointing,
                        seed=seed)
        check_backends(names)
        check_model_fits(cfg, run_device, base.batch, base.seq)
    out_dir = prepare_out(out, force)
    console.print(f"fusedce-profile model: {cfg.name} ({cfg.num_parameters() / 1e6:.1f} M parameters), "
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
        wall = result.extra.get("wall_s")
        console.print(f"  {job.label}: {detail}" + (f" [{wall:.0f} s]" if wall is not None else ""), markup=False)
        summary.append({"backend": job.label, "status": result.status, "peak_bytes": m.peak if m else None,
                        "loss_bytes": m.loss_extra if m else None, "smi_peak_bytes": m.smi_peak if m else None})
    fits = []
    if fit is not None:
        limit = int(fit * GIB)
        for name in names:
            # Start where this back-end's measured step says the limit is reached: a close guess
            # costs two or three probes (each a fresh process) instead of a search from --batch.
            start = predicted_start(measured[name], fit_axis, limit, fit_max) or getattr(base, fit_axis)
            job = dataclasses.replace(base, backend=name, **{fit_axis: start})
            found = fit_backend(job, fit_axis, limit, fit_max, runner=run_in_worker)
            fits.append(found)
            save_fits(out_dir, fits)  # saved per back-end: a run cut by a time limit keeps the searches done
            probes = ", ".join(f"{n}:{'fits' if ok else 'no'}" for n, ok in found.search.probes)
            console.print(f"  fit {format_bytes(limit)}: {name}: largest {fit_axis} = {found.search.largest} "
                          f"(probes {probes})", markup=False)
    report_path = write_model_report(out_dir)
    console.print(f"report: {report_path}", markup=False)
    if as_json:
        print(json.dumps({"out": str(out_dir), "results": summary,
                          "fit": [{"backend": f.backend, "axis": f.axis, "largest": f.search.largest} for f in fits]}))
    if nothing_measured([row["status"] for row in summary]):
        console.print("every job failed (see the lines above and logs/): exit code 1", markup=False)
        raise typer.Exit(exit_codes.CHECK_FAILED)


def parity(
    preset: PresetOption = None,
    config: ConfigOption = None,
    tied: TiedOption = None,
    backend: BackendOption = None,
    steps: Annotated[int, typer.Option(help="Training steps per back-end.", min=10)] = 300,
    batch: Annotated[int, typer.Option(help="Batch size.", min=1)] = 8,
    seq: Annotated[int, typer.Option(help="Sequence length.", min=2)] = 64,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 3e-3,
    reduction: Annotated[str, typer.Option(help="mean or sum.")] = "mean",
    bias: Annotated[bool, typer.Option("--bias", help="Give the LM head a (random) bias.")] = False,
    ignore_frac: Annotated[float, typer.Option(help="Fraction of targets that are padding (-100).")] = 0.0,
    loss_tol: Annotated[float, typer.Option(help="Allowed relative difference of the final loss.")] = 0.02,
    control: Annotated[bool, typer.Option(
        help="First train torch again from initial weights moved by one rounding: its gap to torch is "
             "the run's noise floor, and final losses are judged against it.")] = True,
    seed: SeedOption = 0,
    device: DeviceOption = None,
    mode: ModeOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Train from the same init on the same batches with torch and each back-end; exit 1 on divergence."""
    from profiler.environment import collect_environment, save_environment
    from profiler.training.parity import ParitySettings, run_parity, save_parity_report
    from reports.parity_report import gap_sentences, parity_table, write_parity_report

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    cfg = _config(preset, config, tied, "tiny")
    compared = _backends(backend, ["fusedce"])[1:]
    if not compared:
        raise fail("parity compares back-ends with torch: give at least one --backend other than torch")
    with usage_errors():
        check_backends(compared)
        check_model_fits(cfg, run_device, batch, seq)
    with usage_errors():
        settings = ParitySettings(
            config=cfg, backends=compared, steps=steps, batch=batch,
            seq=seq, lr=lr, device=run_device, mode=mode or ("amp-bf16" if run_device.startswith("cuda") else "fp32"),
            reduction=reduction, bias=bias, ignore_frac=ignore_frac, loss_tolerance=loss_tol, seed=seed,
            control=control)
    out_dir = prepare_out(out, force)
    console.print(f"fusedce-profile parity: {cfg.name}, {steps} steps, {settings.mode} on {run_device}, "
                  f"seed {seed}; writing to {out_dir}", markup=False)
    save_environment(out_dir, collect_environment())

    def save(partial) -> None:  # saved after each back-end: a run cut by a time limit keeps what it trained
        save_parity_report(out_dir, partial)
        write_parity_report(out_dir)

    try:
        result = run_parity(settings,
                            progress=lambda name: console.print(f"  training with {name} ...", markup=False),
                            on_curve=save)
    except RuntimeError as exc:  # the torch reference itself failed
        raise fail(str(exc)) from None
    save(result)
    summary = out_dir / "summary.md"
    table = parity_table(result)
    for row in table.itertuples(index=False):
        console.print(f"  {row[0]}: {row[1]}, final loss {row[2]}, rel. diff {row[3]}, worst grad {row[5]}"
                      + (f" — {row[6]}" if row[6] else ""), markup=False)
    for sentence in gap_sentences(result):
        console.print(f"  {sentence}", markup=False)
    verdict = "PASS" if result.passed else "FAIL"
    if not result.reference_learned:
        console.print("  torch did not learn on this data: raise --steps or --lr", markup=False)
    console.print(f"parity: {verdict}; report: {summary}", markup=False)
    if as_json:
        print(json.dumps({"out": str(out_dir), "passed": result.passed,
                          "verdicts": [dataclasses.asdict(v) for v in result.verdicts]}))
    raise typer.Exit(exit_codes.OK if result.passed else exit_codes.PARITY_FAILED)


def doctor(
    loss: Annotated[str, typer.Option(
        "--loss", help="Your loss wrapper 'package.module:callable', called fn(model, input_ids, labels) -> "
                       "scalar; see profiler.training.doctor for the contract.")],
    preset: PresetOption = None,
    config: ConfigOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Check a loss wrapper against the reference on a small model: one verdict per item, exit 1 on a failure."""
    from profiler import store
    from profiler.environment import collect_environment, save_environment
    from profiler.training.doctor import DoctorRun, load_wrapper, run_doctor
    from reports.doctor_report import write_doctor_report

    console = make_console(to_stderr=as_json)
    with usage_errors():
        check_loss_wrapper(loss)
    cfg = _config(preset, config, None, "tiny")
    if cfg.num_parameters() > 50_000_000:
        raise fail(f"doctor runs on the CPU in fp32: {cfg.name} has {cfg.num_parameters() / 1e6:.0f} M "
                    "parameters; use a small config (the wiring does not depend on size)")
    with usage_errors():
        fn = load_wrapper(loss)
    run = DoctorRun(loss, cfg.name, run_doctor(fn, cfg))
    for c in run.checks:
        console.print(f"  [{c.verdict:^7}] {c.item}: {c.evidence}", markup=False)
    console.print(f"doctor: {'PASS' if run.passed else 'FAIL'}", markup=False)
    if out is not None:
        out_dir = prepare_out(out, force)
        save_environment(out_dir, collect_environment())
        store.write_json(out_dir / store.DOCTOR_FILE, run.to_dict())
        console.print(f"report: {write_doctor_report(out_dir)}", markup=False)
    if as_json:
        print(json.dumps({"passed": run.passed, "checks": [dataclasses.asdict(c) for c in run.checks]}))
    raise typer.Exit(exit_codes.OK if run.passed else exit_codes.PARITY_FAILED)
