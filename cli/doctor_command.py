"""``doctor``: the user's loss wrapper checked on the user's model against the model's own loss;
the report folder is written by :mod:`fusedce_reports.doctor_report`. Exit codes (:mod:`fusedce_cli.exit_codes`):
0 ok, 1 a check failed, 2 bad usage or input."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Optional

import typer

from fusedce_cli import exit_codes
from fusedce_cli.checks import check_loss_wrapper
from fusedce_cli.console import make_console
from fusedce_cli.model_options import (ConfigOption, HFOption, HeadOption, PresetOption, SeedOption, TiedOption,
                               UserModelOption, default_preset, model_source)
from fusedce_cli.options import DeviceOption, ForceOption, JsonOption, OutOption, prepare_out, resolve_device
from fusedce_cli.parsing import parse_mode
from fusedce_cli.usage import fail, usage_errors


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
        "--mode", help="amp-bf16 (bf16 autocast, fp32 weights; default on a GPU; Lightning's bf16-mixed) or fp32 "
                      "(default on the CPU; Lightning's 32-true).")] = None,
    batch: Annotated[int, typer.Option(help="Rows of the padded test batch.", min=2)] = 4,
    seq: Annotated[int, typer.Option(help="Tokens per row of the test batch.", min=8)] = 32,
    seed: SeedOption = 0,
    out: OutOption = None,
    force: ForceOption = False,
    as_json: JsonOption = False,
) -> None:
    """Check your loss wrapper on your model against the model's own loss: one verdict per item, exit 1 on a failure."""
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.judgements.doctor.doctor import cpu_size_guard, load_wrapper, run_doctor
    from fusedce_reports.doctor_report import write_doctor_report

    console = make_console(to_stderr=as_json)
    with usage_errors():
        check_loss_wrapper(loss)
    run_device = resolve_device(device)
    on_gpu = run_device.startswith("cuda")
    mode = parse_mode(mode, ("amp-bf16", "fp32"))
    if mode == "amp-bf16" and not on_gpu:
        raise fail("--mode amp-bf16 needs a CUDA device (--device cuda); on the CPU doctor runs in fp32")
    with usage_errors():
        fn = load_wrapper(loss)
    source = model_source(preset, config, hf, user_model, head, tied, default_preset(run_device))
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
