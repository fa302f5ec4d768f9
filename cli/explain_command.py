"""``explain``: which model configurations explain two nvidia-smi readings (naive vs fused loss),
from calibration steps; the report folder is written by :mod:`fusedce_reports.explain_report`. Exit codes
(:mod:`fusedce_cli.exit_codes`): 0 ok, 2 bad usage or input."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Optional

import typer

from fusedce_cli.console import make_console
from fusedce_cli.model_options import (ConfigOption, HFOption, HeadOption, ModeOption, PresetOption, TiedOption,
                               UserModelOption, default_preset, model_source)
from fusedce_cli.parsing import parse_counts
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from fusedce_cli.usage import fail, usage_errors


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
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.judgements.explain import records as ex
    from fusedce_profiler.judgements.explain import calibration as ex_cal
    from fusedce_profiler.judgements.explain import conclusion as ex_con
    from fusedce_profiler.judgements.explain import verdict as ex_ver
    from fusedce_profiler.instrument.step.jobs import ModelJob, run_job_in_worker
    from fusedce_profiler.instrument.worker import Worker, WorkerDied
    from fusedce_reports.explain_report import write_explain_report

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    source = model_source(preset, config, hf, user_model, head, tied, default_preset(run_device))
    cfg = source.config
    with usage_errors():
        seqs = tuple(parse_counts(seq_candidates, "--seq-candidates"))
        batches = tuple(parse_counts(calibration_batches or ("2,4" if on_gpu else "1,2"), "--calibration-batches"))
        if len(batches) < 2:
            raise ValueError("--calibration-batches needs at least two different batch sizes")
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
        from fusedce_profiler.instrument.step.jobs import ModelResult

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
        decided = False  # the report names the misses (fusedce_reports.explain_report)
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
