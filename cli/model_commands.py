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
    "--mode", help="amp-bf16 (fp32 master weights, bf16 autocast), bf16 (pure bf16 parameters; model only) or "
                   "fp32. Default amp-bf16 (parity on CPU: fp32).")]
SeedOption = Annotated[int, typer.Option(
    help="Seed of the model's initialisation and of the data (a second seed repeats a comparison on "
         "another trajectory).", min=0)]
HFOption = Annotated[Optional[str], typer.Option(
    "--hf", help="A Hugging Face model built with AutoModelForCausalLM.from_config (random weights, no download): "
                 "a config.json, a folder holding one, or a preset name (needs pip install \"fusedce[hf]\").")]
UserModelOption = Annotated[Optional[str], typer.Option(
    "--model", help="Your own model: 'package.module:factory' returning an nn.Module whose forward(input_ids) "
                    "returns logits (the factory may take the --preset/--config ModelConfig).")]
HeadOption = Annotated[Optional[str], typer.Option(
    "--head", help="Attribute path of the LM head module (default: get_output_embeddings(), else the last "
                   "nn.Linear with out_features = vocabulary).")]
TraceOption = Annotated[bool, typer.Option(
    "--trace/--no-trace", help="Attribute each back-end's peak by module and kind and run the logits detector "
                               "(one more, profiled training step).")]
BackendOption = Annotated[Optional[list[str]], typer.Option(
    "--backend", metavar="NAME", help="Loss back-end (repeatable): torch, torch-compile, torch-native, fusedce, "
                      "fusedce-min, fusedce-fast, liger, cce, or module:callable with the back-end signature "
                      "(hidden, weight, target, bias, **options).")]


def _config(preset: Optional[str], config: Optional[Path], tied: Optional[bool], default: str) -> ModelConfig:
    if preset and config:
        raise fail("--preset and --config both name a model: give one of them")
    with usage_errors():
        model = load_config(config) if config else get_preset(preset or default)
    return model if tied is None else dataclasses.replace(model, tie_word_embeddings=tied)


def _source(preset: Optional[str], config: Optional[Path], hf: Optional[str], user_model: Optional[str],
            head: Optional[str], tied: Optional[bool], default: str):
    """The model source of the options: --hf, --model (with an optional --preset/--config
    passed to the factory), else the built-in GPT of --preset/--config."""
    from profiler.models.source import BuiltinSource, HFSource, MissingDependency, UserSource

    if hf and user_model:
        raise fail("--hf and --model both name a model: give one of them")
    if hf and (preset or config):
        raise fail("--hf names the model; --preset/--config are for the built-in model or a --model factory")
    try:
        if hf:
            from profiler.models.source import _require_transformers

            _require_transformers()
            with usage_errors():
                source = HFSource.from_reference(hf, head_path=head)
        elif user_model:
            given = _config(preset, config, None, default) if (preset or config) else None
            with usage_errors():
                source = UserSource(user_model, given, head_path=head)
        else:
            if head:
                raise fail("--head applies to --hf and --model sources (the built-in model's head is lm_head)")
            source = BuiltinSource(_config(preset, config, None, default))
    except MissingDependency as exc:
        raise fail(str(exc)) from None
    if tied is not None:
        with usage_errors():
            source = source.with_tie(tied)
    return source


def _backends(backend: Optional[list[str]], default: list[str]) -> list[str]:
    from profiler.backends import BUILTIN_BACKENDS, MODEL_BACKENDS

    names = parse_backends(backend, list(BUILTIN_BACKENDS) + list(MODEL_BACKENDS)) or default
    return ["torch"] + [b for b in names if b != "torch"]  # torch first: the reference


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
    from cli.defaults import installed_backends
    from profiler import store
    from profiler.environment import collect_environment, save_environment
    from profiler.training.fit import FIT_AXES, FitResult, fit_backends
    from profiler.training.jobs import ModelJob, append_model_result, run_job_in_worker
    from reports.model_report import logits_status, write_model_report
    from reports.units import format_bytes, format_percent

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    source = _source(preset, config, hf, user_model, head, tied, "user-gpt" if on_gpu else "tiny")
    cfg = source.config
    if fit_axis not in FIT_AXES:
        raise fail(f"--fit-axis must be one of {', '.join(FIT_AXES)}, got {fit_axis!r}")
    if fit is not None and fit <= 0:
        raise fail(f"--fit must be a positive number of GiB, got {fit}")
    names = _backends(backend, installed_backends(run_device))
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
            from profiler.attribution import logits_verdict

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


def _parameter_count(source) -> int:
    """The model's parameter count, from a build on the meta device (nothing allocated); the
    config's estimate when the model cannot be built there."""
    try:
        built = source.build("meta")
        return sum(p.numel() for p in {id(p): p for p in built.module.parameters()}.values())
    except Exception:  # a factory that needs real tensors
        return source.config.num_parameters()


def doctor(
    loss: Annotated[str, typer.Option(
        "--loss", help="Your loss wrapper 'package.module:callable', called fn(model, batch) -> scalar (or "
                       "fn(model, input_ids, labels)); see the README's doctor contract.")],
    preset: PresetOption = None,
    config: ConfigOption = None,
    hf: HFOption = None,
    user_model: UserModelOption = None,
    head: HeadOption = None,
    tied: TiedOption = None,
    device: DeviceOption = None,
    mode: Annotated[Optional[str], typer.Option(
        "--mode", help="amp-bf16 (bf16 autocast, fp32 weights; default on a GPU) or fp32 (default on the CPU).")] = None,
    batch: Annotated[int, typer.Option(help="Rows of the padded test batch.", min=2)] = 4,
    seq: Annotated[int, typer.Option(help="Tokens per row of the test batch.", min=8)] = 32,
    seed: SeedOption = 0,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Check your loss wrapper on your model against the model's own loss: one verdict per item, exit 1 on a failure."""
    from profiler import store
    from profiler.environment import collect_environment, save_environment
    from profiler.training.doctor import cpu_size_guard, load_wrapper, run_doctor
    from reports.doctor_report import write_doctor_report

    console = make_console(to_stderr=as_json)
    with usage_errors():
        check_loss_wrapper(loss)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    if mode is not None and mode not in ("amp-bf16", "fp32"):
        raise fail(f"--mode must be amp-bf16 or fp32 for doctor, got {mode!r}")
    if mode == "amp-bf16" and not on_gpu:
        raise fail("--mode amp-bf16 needs a CUDA device (--device cuda); on the CPU doctor runs in fp32")
    with usage_errors():
        fn = load_wrapper(loss)
    source = _source(preset, config, hf, user_model, head, tied, "user-gpt" if on_gpu else "tiny")
    with usage_errors():
        parameters = _parameter_count(source)
    if not on_gpu:
        reason = cpu_size_guard(parameters, source.describe())
        if reason is not None:
            raise fail(reason)
    with usage_errors():
        built = source.build(run_device, seed=seed)
    console.print(f"fusedce-profile doctor: {loss} on {source.describe()} ({parameters / 1e6:.1f} M parameters, "
                  f"{run_device}, {mode or ('amp-bf16' if on_gpu else 'fp32')})", markup=False)
    run = run_doctor(fn, built, source=source, device=run_device, mode=mode, batch=batch, seq=seq, seed=seed,
                     spec=loss)
    for c in run.checks:
        console.print(f"  [{c.verdict:^11}] {c.item}: {c.evidence}", markup=False)
    console.print(f"doctor: {'PASS' if run.passed else 'FAIL'}", markup=False)
    if out is not None:
        out_dir = prepare_out(out, force)
        save_environment(out_dir, collect_environment())
        store.write_json(out_dir / store.DOCTOR_FILE, run.to_dict())
        console.print(f"report: {write_doctor_report(out_dir)}", markup=False)
    if as_json:
        print(json.dumps({"passed": run.passed, "checks": [dataclasses.asdict(c) for c in run.checks]}))
    raise typer.Exit(exit_codes.OK if run.passed else exit_codes.PARITY_FAILED)


def explain(
    naive: Annotated[float, typer.Option("--naive", help="nvidia-smi MiB with the naive loss (what you saw).")],
    fused: Annotated[float, typer.Option("--fused", help="nvidia-smi MiB with the fused loss.")],
    card: Annotated[float, typer.Option("--card", help="The GPU's total memory, GiB (e.g. 24).")],
    preset: PresetOption = None,
    config: ConfigOption = None,
    hf: HFOption = None,
    user_model: UserModelOption = None,
    head: HeadOption = None,
    tied: TiedOption = None,
    batch: Annotated[Optional[int], typer.Option(help="B, if you know it (else enumerated).", min=1)] = None,
    seq: Annotated[Optional[int], typer.Option(help="T, if you know it (else --seq-candidates).", min=1)] = None,
    seq_candidates: Annotated[str, typer.Option(help="T values to consider when --seq is not given.")] = "512,1024,2048",
    attention: Annotated[Optional[str], typer.Option(help="eager or sdpa, if known (else both).")] = None,
    checkpointing: Annotated[Optional[bool], typer.Option(
        "--checkpointing/--no-checkpointing", help="Whether activation checkpointing was on, if known.")] = None,
    eval_step: Annotated[Optional[bool], typer.Option(
        "--eval-step/--no-eval-step", help="Whether an evaluation pass (Lightning's sanity check) ran first.")] = None,
    fused_backend: Annotated[str, typer.Option(
        help="The fused loss to calibrate with: fusedce, liger, or your module:callable.")] = "fusedce",
    tolerance: Annotated[float, typer.Option(help="Allowed relative difference on each reading.")] = 0.05,
    calibration_batches: Annotated[Optional[str], typer.Option(
        help="Batch sizes of the calibration steps (default 2,4 on a GPU, 1,2 on the CPU).")] = None,
    confirm_top: Annotated[int, typer.Option("--confirm", help="On a GPU, run the N closest hypotheses at full size.",
                                             min=0)] = 3,
    device: DeviceOption = None,
    mode: ModeOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Which configurations explain two nvidia-smi readings (naive vs fused): consistent, ruled out, and the run that decides."""
    from profiler import store
    from profiler.environment import collect_environment, save_environment
    from profiler.training import explain as ex
    from profiler.training import explain_calibration as ex_cal
    from profiler.training import explain_conclusion as ex_con
    from profiler.training import explain_verdict as ex_ver
    from profiler.training.jobs import ModelJob, run_job_in_worker
    from profiler.worker import Worker, WorkerDied
    from reports.explain_report import write_explain_report

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    source = _source(preset, config, hf, user_model, head, tied, "user-gpt" if on_gpu else "tiny")
    cfg = source.config
    with usage_errors():
        seqs = tuple(int(s) for s in seq_candidates.split(",") if s.strip())
        batches = tuple(int(b) for b in (calibration_batches or ("2,4" if on_gpu else "1,2")).split(","))
        if len(batches) < 2 or min(batches) < 1:
            raise ValueError("--calibration-batches needs at least two positive batch sizes")
        seqs = tuple(s for s in seqs if s <= cfg.max_position_embeddings) or seqs
        obs = ex.Observation(naive, fused, card, batch=batch, seq=seq, attention=attention, tied=tied,
                             checkpointing=checkpointing, eval_step=eval_step, mode=mode or "amp-bf16",
                             fused_backend=fused_backend, tolerance=tolerance)
        base = ModelJob(cfg, "torch", batches[0], seq or seqs[0], device=run_device, mode=obs.mode,
                        source=None if source.kind == "builtin" else source.to_dict(), trace=False)
    if attention and attention not in source.attention_impls:
        raise fail(f"--attention must be one of {', '.join(source.attention_impls)}, got {attention!r}")
    ties = (cfg.tie_word_embeddings,) if source.kind == "user" else (False, True)
    families = ex_cal.enumerate_families(obs, attention_impls=("eager", "sdpa"), tie_choices=ties,
                                         seq_candidates=seqs)
    out_dir = prepare_out(out, force)
    console.print(f"fusedce-profile explain: {source.describe()}, {len(families)} configuration families × "
                  f"torch/{fused_backend} × B={','.join(map(str, batches))}; writing to {out_dir}", markup=False)
    save_environment(out_dir, collect_environment())
    logs = out_dir / store.LOGS_DIR

    workers: list = []

    def runner(jobs):
        """The jobs in one long-lived worker (started once: a fresh process per step would cost
        seconds each); a worker that dies is replaced and its jobs count as errors."""
        from profiler.training.jobs import ModelResult

        if not workers:
            workers.append(Worker(logs))
        try:
            raw = workers[0].call("training-steps", {"jobs": [dataclasses.asdict(j) for j in jobs]}, 600)
            return [ModelResult.from_dict(r) for r in raw]
        except WorkerDied as died:
            workers.pop().close()
            return [ModelResult(job=j, status="error", message=died.reason) for j in jobs]

    notes, confirmed = [], False
    try:
        calibrations = ex_cal.calibrate(base, families, ("torch", fused_backend), batches, runner,
                                        progress=lambda line: console.print(f"  {line}", markup=False))
        hypotheses = ex_ver.build_hypotheses(obs, calibrations)
        if on_gpu and confirm_top and hypotheses:
            console.print(f"  confirming the {min(confirm_top, len(hypotheses))} closest hypotheses at full size ...",
                          markup=False)
            # Full-size steps each in a fresh process: their reserved figures must not inherit a cache.
            ex_ver.confirm(hypotheses, base, fused_backend, obs,
                           lambda jobs: [run_job_in_worker(j, logs) for j in jobs], top=confirm_top)
            confirmed = True
    finally:
        for w in workers:
            w.close()
    if not on_gpu:
        notes.append("On the CPU the figures are peak allocated bytes (no allocator cache, no CUDA context): they "
                     "cannot be compared with nvidia-smi readings, and no hypothesis could be confirmed by a "
                     "full-size run. Run this command on the GPU the readings came from.")
    model_args = {"builtin": f"--preset {cfg.name}" if preset or not config else f"--config {config}",
                  "hf": f"--hf {hf}", "user": f"--model {user_model}"}[source.kind]
    if tied is not None and source.kind != "user":
        model_args += " --tied" if tied else " --untied"
    decided, conclusion = ex_con.conclude(hypotheses, obs)
    if ex_ver.calibration_misses(hypotheses, tolerance):
        decided = False  # the report names the misses (reports.explain_report)
    separation = None if decided else ex_con.separating_measurement(hypotheses, obs, model_args)
    explanation = ex.Explanation(observation=obs, model=source.describe(), source=source.to_dict(), device=run_device,
                                 metric="nvidia-smi at the step's peak (context + peak reserved)" if on_gpu else
                                 "peak allocated bytes (CPU)", calibrations=calibrations, hypotheses=hypotheses,
                                 separation=separation, decided=decided, conclusion=conclusion, confirmed=confirmed,
                                 notes=notes)
    ex.save_explanation(out_dir, explanation)
    summary = write_explain_report(out_dir)
    consistent = explanation.consistent
    console.print(f"  {len(consistent)} consistent, {len(hypotheses) - len(consistent)} ruled out "
                  f"(±{tolerance:.0%}); {'decided' if decided else 'NOT decided'}: {conclusion}", markup=False)
    for h in consistent[:5]:
        console.print(f"    consistent: {h.label()} — {h.why}", markup=False)
    if separation is not None:
        console.print(f"  to separate them: {separation.sentence}", markup=False)
    console.print(f"report: {summary}", markup=False)
    if as_json:
        print(json.dumps({"out": str(out_dir), "decided": decided, "conclusion": conclusion,
                          "consistent": [h.label() for h in consistent],
                          "best": consistent[0].label() if consistent else None}))
