"""``parity``: train from the same init on the same batches with torch and each back-end and
compare; the report folder is written by :mod:`fusedce_reports.parity_report`. Exit codes
(:mod:`fusedce_profile.exit_codes`): 0 ok, 1 a back-end diverged, 2 bad usage or input."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer

from fusedce_cli import exit_codes
from fusedce_profile.checks import check_backends, check_model_fits
from fusedce_profile.console import make_console
from fusedce_cli.model_options import (BackendOption, ConfigOption, ModeOption, PresetOption, SeedOption, TiedOption,
                               loss_backends, model_config)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from fusedce_cli.usage import fail, usage_errors


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
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.judgements.parity import ParitySettings, run_parity, save_parity_report
    from fusedce_reports.parity_report import gap_sentences, parity_table, write_parity_report

    console = make_console(to_stderr=as_json)
    run_device = resolve_device(device)
    cfg = model_config(preset, config, tied, "tiny")
    compared = loss_backends(backend, ["fusedce"])[1:]
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
