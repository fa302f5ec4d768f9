"""``model``: one training step of a model per loss back-end, measured (:func:`fusedce_profile.model.profile_model`);
the report folder is written by :mod:`fusedce_reports.model_report`. Exit codes (:mod:`fusedce_cli.exit_codes`): 0 ok,
1 every job failed, a back-end named with --backend failed in every job, or the --model factory failed; 2 bad usage
or input; 130/143 interrupted (the finished jobs are kept; --resume continues)."""
from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from fusedce_cli.console import make_console
from fusedce_cli.model_options import (BackendOption, ConfigOption, FactoryTimeoutOption, HFOption, HeadOption,
                                       ModeOption, PresetOption, SeedOption, TiedOption, UserModelOption,
                                       factory_errors)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption
from fusedce_cli.signals import stop_on_sigterm
from fusedce_cli.usage import usage_errors

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
    batch: Annotated[Optional[int], typer.Option(help="Batch size B (default 8 on a GPU, 4 on the CPU).")] = None,
    seq: Annotated[Optional[int], typer.Option(
        help="Sequence length T (default 1024 on a GPU, 64 on the CPU).")] = None,
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
    fit_max: Annotated[int, typer.Option(help="Largest value --fit tries.")] = 1024,
    seed: SeedOption = 0,
    device: DeviceOption = None,
    mode: ModeOption = None,
    factory_timeout: FactoryTimeoutOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run in --out: measure only the jobs it has no row for.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Measure one training step of a model per loss back-end: where the peak goes, what each saves."""
    from fusedce_profile.model import model_command

    console = make_console(to_stderr=as_json)
    with usage_errors(), stop_on_sigterm(), factory_errors():
        outcome = model_command(
            preset=preset, config=config, tied=tied, hf=hf, model=user_model, head=head, trace=trace, batch=batch,
            seq=seq, backend=backend, attention=attention, checkpointing=checkpointing, eval_step=eval_step, fit=fit,
            fit_axis=fit_axis, fit_max=fit_max, seed=seed, device=device, mode=mode, factory_timeout=factory_timeout,
            out=out, force=force, resume=resume, console=console)
    if as_json:
        print(json.dumps(outcome.summary))
    raise typer.Exit(outcome.exit_code)
