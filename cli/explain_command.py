"""``explain``: which model configurations explain two nvidia-smi readings (naive vs fused loss).

Parses the options, calls :func:`fusedce_profile.explain.explain` and prints its conclusion.
Exit codes (:mod:`fusedce_cli.exit_codes`): 0 ok, 1 a ``--model`` factory that failed (one
line) or a back-end that failed in every calibration step (nothing judged; one line per cause), 2 bad usage or input (one line, before any work), 130 / 143 interrupted (the finished
steps are kept; ``--resume`` continues).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli import exit_codes
from fusedce_cli.console import make_console
from fusedce_cli.model_options import (ConfigOption, HFOption, HeadOption, ModeOption, PresetOption, TiedOption,
                                       UserModelOption, factory_errors)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out
from fusedce_cli.parsing import parse_counts
from fusedce_cli.signals import interrupt_exit_code, stop_on_sigterm
from fusedce_cli.usage import fail, usage_errors
from fusedce_profiler.instrument.text import one_line


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
    batch: Annotated[Optional[int], typer.Option(help="B, if you know it (else enumerated).")] = None,
    seq: Annotated[Optional[int], typer.Option(help="T, if you know it (else --seq-candidates).")] = None,
    seq_candidates: Annotated[str, typer.Option(help="T values to consider when --seq is not given.")] = "512,1024,2048",
    attention: Annotated[Optional[str], typer.Option(help="eager or sdpa, if known (else both).")] = None,
    checkpointing: Annotated[Optional[bool], typer.Option(
        "--checkpointing/--no-checkpointing", help="Whether activation checkpointing was on, if known.")] = None,
    eval_step: Annotated[Optional[bool], typer.Option(
        "--eval-step/--no-eval-step", help="Whether an evaluation pass (Lightning's sanity check) ran first.")] = None,
    fused_backend: Annotated[str, typer.Option(
        help="The fused loss to calibrate with: fusedce, liger, or your module:callable.")] = "fusedce",
    context_mib: Annotated[Optional[float], typer.Option(
        "--context-mib", help="Your card's CUDA context, MiB (nvidia-smi of a process that only initialised CUDA); "
                              "default: this GPU's, with ±250 MiB uncertainty.")] = None,
    fused_larger: Annotated[bool, typer.Option(
        "--fused-larger", help="The fused reading really was above the naive one (else refused as swapped).")] = False,
    calibration_batches: Annotated[Optional[str], typer.Option(
        help="Batch sizes of the calibration steps (default: 8192 and 16384 tokens per T on a GPU, 2,4 on the CPU).")] = None,
    confirm_top: Annotated[int, typer.Option("--confirm", help="On a GPU, measure the N best consistent hypotheses "
                                                               "at full size under the card's cap.")] = 3,
    cache: Annotated[Optional[Path], typer.Option(
        "--cache", help="A steps file shared between explanations of the same model (read and appended).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted explanation in --out.")] = False,
    device: DeviceOption = None,
    mode: ModeOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Which configurations explain two nvidia-smi readings (naive vs fused): consistent, ruled out, and the run that decides."""
    from fusedce_profile.errors import UsageError
    from fusedce_profile.explain import explain_plan, explanation_stamp, validate, what_the_stop_left

    console = make_console(to_stderr=as_json)
    with usage_errors():
        seqs = tuple(parse_counts(seq_candidates, "--seq-candidates"))
        batches = tuple(parse_counts(calibration_batches, "--calibration-batches")) if calibration_batches else None
    kwargs = dict(naive=naive, fused=fused, card=card, preset=preset, config=config, hf=hf, model=user_model,
                  head=head, tied=tied, batch=batch, seq=seq, seq_candidates=seqs, attention=attention,
                  checkpointing=checkpointing, eval_step=eval_step, fused_backend=fused_backend,
                  calibration_batches=batches, confirm=confirm_top, device=device, mode=mode,
                  context_mib=context_mib, fused_larger=fused_larger, cache=cache)
    try:
        with factory_errors():  # a --model factory that fails: one line, exit 1
            plan = validate(**kwargs)  # refuse impossible input before the folder is made
    except UsageError as exc:
        raise fail(str(exc)) from None
    out_dir = prepare_out(out, force, resume, kind="explain")
    stamp_before = explanation_stamp(out_dir)  # an explanation stored before this run is not its own
    console.print(f"fusedce-profile explain: writing to {one_line(out_dir)}", markup=False)
    try:
        with stop_on_sigterm():
            e = explain_plan(plan, out=out_dir, resume=resume,
                             progress=lambda line: console.print(f"  {line}", markup=False))
    except UsageError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt as stopped:
        console.print(what_the_stop_left(out_dir, stopped, stamp_before), markup=False)
        raise typer.Exit(interrupt_exit_code(stopped)) from None
    consistent = e.consistent
    verdict = "predictions only (CPU), no verdict" if e.prediction_only else ("decided" if e.decided else
                                                                             "NOT decided")
    console.print(f"  {len(consistent)} consistent ({e.consistent_families} families), "
                  f"{len(e.hypotheses) - len(consistent)} ruled out; {verdict}: {e.conclusion}", markup=False)
    for h in consistent[:5]:
        console.print(f"    consistent: {h.label()} — {h.why}", markup=False)
    if e.separation is not None:
        console.print(f"  to separate them: {e.separation.sentence}", markup=False)
    console.print(f"report: {out_dir / 'summary.md'}", markup=False)
    for sentence in e.failed_steps:
        typer.echo(f"note: {one_line(sentence)}", err=True)
    by_message: dict[str, list[str]] = {}  # one line per cause: a --model factory that failed fails every back-end
    for backend, message in e.failed_backends.items():
        by_message.setdefault(message, []).append(backend)
    for message, backends in by_message.items():
        typer.echo(f"error: {one_line(', '.join(backends))} failed in every calibration step; the first: "
                   f"{one_line(message)}", err=True)
    if as_json:
        print(json.dumps({"out": str(out_dir), "decided": e.decided, "prediction_only": e.prediction_only,
                          "conclusion": e.conclusion, "consistent": [h.label() for h in consistent],
                          "consistent_families": e.consistent_families,
                          "best": consistent[0].label() if consistent else None,
                          "failed_backends": e.failed_backends}))
    if e.failed_backends:
        raise typer.Exit(exit_codes.CHECK_FAILED)
