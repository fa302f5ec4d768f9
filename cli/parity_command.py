"""``parity``: train from the same init on the same batches with torch and each back-end and
compare (:func:`fusedce_profile.parity.parity`); the report folder is written by
:mod:`fusedce_reports.parity_report`. Exit codes (:mod:`fusedce_cli.exit_codes`): 0 ok, 1 a back-end
diverged, 2 bad usage or input, 130/143 interrupted (the back-ends trained so far are kept and reported;
--resume continues)."""
from __future__ import annotations

import json
from typing import Annotated

import typer

from fusedce_cli.console import make_console
from fusedce_cli.model_options import BackendOption, ConfigOption, ModeOption, PresetOption, SeedOption, TiedOption
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption
from fusedce_cli.signals import stop_on_sigterm
from fusedce_cli.usage import usage_errors


def parity(
    preset: PresetOption = None,
    config: ConfigOption = None,
    tied: TiedOption = None,
    backend: BackendOption = None,
    steps: Annotated[int, typer.Option(help="Training steps per back-end.")] = 300,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 8,
    seq: Annotated[int, typer.Option(help="Sequence length.")] = 64,
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
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run in --out (same options): keep the back-ends it trained.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Train from the same init on the same batches with torch and each back-end; exit 1 on divergence."""
    from fusedce_profile.parity import parity_command

    console = make_console(to_stderr=as_json)
    with usage_errors(), stop_on_sigterm():
        outcome = parity_command(preset=preset, config=config, tied=tied, backend=backend, steps=steps, batch=batch,
                                 seq=seq, lr=lr, reduction=reduction, bias=bias, ignore_frac=ignore_frac,
                                 loss_tol=loss_tol, control=control, seed=seed, device=device, mode=mode, out=out,
                                 force=force, resume=resume, console=console)
    if as_json and outcome.stopped is None:
        print(json.dumps(outcome.summary))
    raise typer.Exit(outcome.exit_code)
