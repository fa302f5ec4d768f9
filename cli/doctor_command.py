"""``doctor``: parse the options, call :func:`fusedce_profile.doctor.doctor`, print its verdicts.
Exit codes (:mod:`fusedce_cli.exit_codes`): 0 every check judged and none failed, 1 a check failed
or the user's code ended the run, 2 bad usage or input, 130/143 interrupted (a partial report
marked interrupted is written)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Annotated, Optional

import typer

from fusedce_cli import exit_codes
from fusedce_cli.console import make_console
from fusedce_cli.model_options import (ConfigOption, HFOption, HeadOption, PresetOption, SeedOption, TiedOption,
                                       UserModelOption)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from fusedce_cli.parsing import parse_mode
from fusedce_cli.signals import interrupt_exit_code, stop_on_sigterm
from fusedce_cli.usage import fail


def doctor(
    loss: Annotated[str, typer.Option(
        "--loss", help="Your loss wrapper 'package.module:callable', called fn(model, batch) -> scalar (or "
                       "fn(model, input_ids, labels); optional keywords num_items_in_batch and reduction); see "
                       "docs/doctor.md.")],
    preset: PresetOption = None,
    config: ConfigOption = None,
    hf: HFOption = None,
    user_model: UserModelOption = None,
    head: HeadOption = None,
    tied: TiedOption = None,
    device: DeviceOption = None,
    mode: Annotated[Optional[str], typer.Option(
        "--mode", help="amp-bf16 (bf16 autocast, fp32 weights; on a GPU or the CPU; default on a GPU; Lightning's "
                       "bf16-mixed) or fp32 (default on the CPU; Lightning's 32-true). Tolerances are measured for "
                       "it on the model's own loss.")] = None,
    batch: Annotated[int, typer.Option(help="Rows of the padded test batch.")] = 4,
    seq: Annotated[int, typer.Option(help="Tokens per row of the test batch.")] = 32,
    seed: SeedOption = 0,
    compile_backend: Annotated[str, typer.Option(
        "--compile-backend", help="torch.compile back-end of the compile check: auto (inductor on a GPU, eager "
                                  "tracing on the CPU), none (skip the check), or a back-end name.")] = "auto",
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds your model factory and loss may take in all before the run is stopped.")] = 600.0,
    memory_limit: Annotated[Optional[float], typer.Option(
        "--memory-limit", help="GiB of host memory the worker running your code, with any process it starts, may use "
                               "(default: 3/4 of the machine's).")] = None,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Check your loss wrapper on your model against the model's own loss: one verdict per item, exit 1 on a failure."""
    from fusedce_profile.doctor import UserCodeFailed, check_arguments, what_the_stop_left
    from fusedce_profile.doctor import doctor as run_doctor
    from fusedce_profile.errors import UsageError

    console = make_console(to_stderr=as_json)
    device = resolve_device(device)
    mode = parse_mode(mode, ("amp-bf16", "fp32"))
    try:
        check_arguments(loss, device=device, mode=mode, batch=batch, seq=seq, seed=seed, timeout_s=timeout,
                        memory_limit_gb=1.0 if memory_limit is None else memory_limit,
                        model_options=(preset, str(config) if config else None, hf, user_model, head))
    except UsageError as exc:
        raise fail(str(exc)) from None
    rank = int(os.environ.get("RANK", "0") or 0)
    if rank > 0:  # under torchrun: one folder per rank, beside rank 0's
        if out is None:
            raise fail("under torchrun doctor needs --out DIR (rank 0 writes DIR, rank N DIR-rankN)")
        out = out.with_name(f"{out.name}-rank{rank}")
    existed = out is not None and out.exists()
    folder = prepare_out(out, force, resume=None)  # doctor has no --resume
    try:
        with stop_on_sigterm():
            run = run_doctor(loss, preset=preset, config=config, hf=hf, model=user_model, head=head, tied=tied,
                             device=device, mode=mode, batch=batch, seq=seq, seed=seed,
                             compile_backend=compile_backend, timeout_s=timeout, memory_limit_gb=memory_limit,
                             out=folder, force=True)
    except UsageError as exc:
        from fusedce_profiler.instrument.store import DOCTOR_FILE

        if not existed and not (folder / DOCTOR_FILE).exists():  # bad input found by the worker: no folder left
            shutil.rmtree(folder, ignore_errors=True)
        raise fail(str(exc)) from None
    except UserCodeFailed as exc:
        console.print(f"doctor: no verdict — {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(exit_codes.PARITY_FAILED) from None
    except KeyboardInterrupt as exc:
        console.print(f"doctor: {what_the_stop_left(folder, exc)}", markup=False)
        raise typer.Exit(interrupt_exit_code(exc)) from None
    console.print(f"fusedce-profile doctor: {loss} on {run.model or run.config} ({run.parameters / 1e6:.1f} M "
                  f"parameters, {run.device}, {run.mode}; gradient tolerance {run.tolerance:.1e})", markup=False)
    for c in run.checks:
        console.print(f"  [{c.verdict:^11}] {c.item}: {c.evidence}", markup=False)
    console.print(f"doctor: {'PASS' if run.passed else 'FAIL'}; report: {folder / 'summary.md'}", markup=False)
    if as_json:
        print(json.dumps({"passed": run.passed, "folder": str(folder),
                          "checks": [dataclasses.asdict(c) for c in run.checks]}))
    raise typer.Exit(exit_codes.OK if run.passed else exit_codes.PARITY_FAILED)
