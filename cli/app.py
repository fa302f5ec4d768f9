"""``fusedce-profile``: the command line (typer + rich).

With no sub-command it runs the built-in default grid (:mod:`fusedce_profile.defaults`) and writes a
report; ``grid`` runs a grid of the user's choosing; ``report DIR`` rebuilds a report from
a run folder (grid, model, parity or doctor) without a GPU; ``env``, ``backends`` and ``presets``
describe what is there; ``model``, ``parity``, ``doctor`` and ``explain`` (from
:mod:`fusedce_cli.model_command`, :mod:`fusedce_cli.parity_command`, :mod:`fusedce_cli.doctor_command`,
:mod:`fusedce_cli.explain_command`) look at a whole training step. Exit codes: :mod:`fusedce_profile.exit_codes`.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusedce_cli.console import make_console
from fusedce_cli.options import CellTimeoutOption, DeviceOption, ForceOption, JsonOption, OutOption, release_command_locks
from fusedce_cli.parsing import parse_counts, parse_devices, parse_floats, parse_modes
from fusedce_cli.signals import stop_on_sigterm
from fusedce_cli.usage import fail, usage_errors

HELP = """Profile the memory, time and parity of LM-head losses (linear + cross-entropy).

Run without a command for the built-in default: the user's head (H=768, V=32777) and the Llama-3 head (H=4096, V=128256) from 1k tokens up, every installed back-end, amp-bf16. On a CPU-only machine: a small grid that takes about a minute.

Exit codes: 0 ok; 1 a check failed (parity or doctor, a back-end that failed in every cell, a model run where every job failed), or a --model factory failed (raised, exited, hung or ran out of its memory guard); 2 bad usage or input (one line naming the argument, before anything is measured), or a run folder that cannot be written; 3 the run could not go on (a worker process could not be started or died at start-up, or the command itself could not import a library or ran out of memory; it wins over 1); 130 interrupted by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (the cells or jobs finished so far are kept and reported).

A --backend module:callable is imported from Python's path, with the current folder first (as python -m does).
"""

# Plain help (click's formatter): typer's rich help shows flags as if they took a value ("--force <bool>").
app = typer.Typer(help=HELP, add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)

ResumeOption = Annotated[bool, typer.Option("--resume", help="Continue the run in --out, skipping finished cells.")]
SnapshotOption = Annotated[bool, typer.Option(
    "--snapshot", help="Record a CUDA memory snapshot per cell and draw its timeline.")]
PresetOption = Annotated[Optional[str], typer.Option(
    "--preset", help="Take H, V and the soft-cap from a built-in model (see `presets`).")]
ConfigOption = Annotated[Optional[Path], typer.Option(
    "--config", help="Take H, V and the soft-cap from a Hugging Face config.json or our JSON/TOML.")]


def _exit_with(outcome, as_json: bool) -> typer.Exit:
    """The exit of a finished command: its ``--json`` summary printed on stdout when asked (and
    when the command stored any), then its exit code."""
    if as_json and outcome.summary:
        sys.stdout.write(json.dumps(outcome.summary, indent=2) + "\n")
    return typer.Exit(outcome.exit_code)


@app.callback(invoke_without_command=True)
def default(
    ctx: typer.Context,
    out: OutOption = None,
    force: ForceOption = False,
    resume: ResumeOption = False,
    snapshot: SnapshotOption = False,
    as_json: JsonOption = False,
    device: DeviceOption = None,
    preset: PresetOption = None,
    config: ConfigOption = None,
    cell_timeout: CellTimeoutOption = None,
) -> None:
    """The built-in default run (when no command is given)."""
    from fusedce_cli.entry import command_starting

    command_starting()  # from here each command handles Ctrl-C and SIGTERM itself
    ctx.call_on_close(release_command_locks)  # the run-folder lock of whichever command runs
    if ctx.invoked_subcommand is not None:
        flags = {param.name: param.opts[0] for param in ctx.command.params}
        given = [flags[name] for name, value in ctx.params.items() if value not in (None, False)]
        if given:
            raise fail(f"{', '.join(given)} given before '{ctx.invoked_subcommand}': "
                       "put options after the command")
        return
    from fusedce_profile.grid import default_command

    console = make_console(to_stderr=as_json)
    with usage_errors(), stop_on_sigterm():
        outcome = default_command(device=device, preset=preset, config=config, out=out, force=force, resume=resume,
                                  snapshot=snapshot, cell_timeout=cell_timeout, console=console)
    raise _exit_with(outcome, as_json)


@app.command()
def grid(
    tokens: Annotated[Optional[str], typer.Option(
        help="Tokens N = B·T, comma-separated (1024,4k,16k). Default 1024,4096,16384.")] = None,
    batch: Annotated[Optional[str], typer.Option(help="Batch sizes B (with --seq, instead of --tokens).")] = None,
    seq: Annotated[Optional[str], typer.Option(help="Sequence lengths T (with --batch).")] = None,
    vocab: Annotated[Optional[str], typer.Option(help="Vocabulary sizes V. Default 32777 or the model's.")] = None,
    hidden: Annotated[Optional[str], typer.Option(help="Hidden sizes H. Default 768 or the model's.")] = None,
    backend: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME",
        help="Back-end (repeatable): torch, torch-compile, torch-native, fusedce, fusedce-min, fusedce-fast, "
             "liger, cce or module:callable (imported with the current folder on the path). "
             "Default: every installed one but fusedce-min and fusedce-fast.")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(
        metavar="MODE", help="amp-bf16 (default), amp-fp16, bf16, fp32 (repeatable).")] = None,
    device: DeviceOption = None,
    bias: Annotated[bool, typer.Option("--bias", help="Give the head a bias.")] = False,
    ignore_frac: Annotated[Optional[str], typer.Option(
        help="Fractions of targets set to ignore_index, e.g. 0,0.3.")] = None,
    label_smoothing: Annotated[Optional[str], typer.Option(help="Label smoothing values.")] = None,
    z_loss: Annotated[Optional[str], typer.Option(help="z-loss coefficients.")] = None,
    softcap: Annotated[Optional[str], typer.Option(help="Logit soft-caps ('none' for none).")] = None,
    reduction: Annotated[str, typer.Option(help="mean, sum or none.")] = "mean",
    repeats: Annotated[int, typer.Option(help="Timed forward+backward steps per cell.")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps before measuring.")] = 1,
    preset: PresetOption = None,
    config: ConfigOption = None,
    out: OutOption = None,
    force: ForceOption = False,
    resume: ResumeOption = False,
    snapshot: SnapshotOption = False,
    as_json: JsonOption = False,
    devices: Annotated[Optional[str], typer.Option(
        help="Spread the cells over these GPUs, one worker each (CUDA_VISIBLE_DEVICES values, "
             "comma-separated: 0,1,2,3). Default: one worker on the default GPU.")] = None,
    cell_timeout: CellTimeoutOption = None,
) -> None:
    """Run a grid of back-ends × shapes × modes × options and write its report.

    --preset/--config set H, V and the soft-cap; --hidden, --vocab and --softcap given
    explicitly take precedence.
    """
    from fusedce_profile.grid import grid_command

    console = make_console(to_stderr=as_json)
    grid_options = dict(  # the option strings parsed here (their messages name the option); checked there
        tokens=parse_counts(tokens, "--tokens"), batch=parse_counts(batch, "--batch"), seq=parse_counts(seq, "--seq"),
        vocab=parse_counts(vocab, "--vocab"), hidden=parse_counts(hidden, "--hidden"),
        backend=backend, mode=parse_modes(mode), devices=parse_devices(devices),
        ignore_frac=parse_floats(ignore_frac, "--ignore-frac"),
        label_smoothing=parse_floats(label_smoothing, "--label-smoothing"), z_loss=parse_floats(z_loss, "--z-loss"),
        softcap=parse_floats(softcap, "--softcap", allow_none=True))
    with usage_errors(), stop_on_sigterm():
        outcome = grid_command(**grid_options, device=device, bias=bias, reduction=reduction, repeats=repeats,
                               warmup=warmup, preset=preset, config=config, out=out, force=force, resume=resume,
                               snapshot=snapshot, cell_timeout=cell_timeout, console=console)
    raise _exit_with(outcome, as_json)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(
        help="A run folder: a grid run's (results.jsonl), a `model` run's (model_results.jsonl), a "
             "`parity` run's (parity.json) or a `doctor` run's (doctor.json).", metavar="DIR")],
    as_json: JsonOption = False,
) -> None:
    """Rebuild every table and plot of a run folder from its stored results (no GPU needed).

    Only JSON and CSV files are read: a folder received from someone else cannot run code.
    """
    from fusedce_profile.report import report_command

    with usage_errors(), stop_on_sigterm():
        outcome = report_command(run_dir, console=make_console(to_stderr=as_json))
    raise _exit_with(outcome, as_json)


@app.command()
def env(as_json: JsonOption = False) -> None:
    """Print the environment block (GPU, driver, CUDA, torch, triton, back-end versions)."""
    from fusedce_profiler.instrument.environment import collect_environment
    from fusedce_reports.environment import environment_lines

    environment = collect_environment()
    if as_json:
        sys.stdout.write(json.dumps(environment, indent=2, default=str) + "\n")
        return
    make_console(to_stderr=False).print("\n".join(environment_lines(environment)), markup=False)


_SHORT_OPTION = {"ignore_index": "ignore", "label_smoothing": "smoothing", "reduction=sum": "sum",
                 "reduction=none": "none"}


@app.command()
def backends(as_json: JsonOption = False) -> None:
    """List the loss back-ends: installed or not, version, devices, options they support."""
    from dataclasses import asdict

    from rich.table import Table
    from rich.text import Text

    from fusedce_profile.checks import SHORT_INSTALL_HINTS, install_hint
    from fusedce_profiler.instrument.backends import list_backends

    infos = list_backends()
    if as_json:
        sys.stdout.write(json.dumps([{**asdict(i), "install": "" if i.available else install_hint(i.name)}
                                     for i in infos], indent=2) + "\n")
        return
    table = Table(header_style="bold")
    for column in ("back-end", "version", "devices", "options", "install"):
        table.add_column(column, no_wrap=column not in ("options", "devices"), overflow="fold")
    for info in infos:
        table.add_row(info.name, info.version if info.available else "not installed", ", ".join(info.devices),
                      " ".join(_SHORT_OPTION.get(o, o) for o in info.options) or "–",
                      Text("" if info.available else SHORT_INSTALL_HINTS.get(info.name, "")),
                      style="" if info.available else "dim")
    console = make_console(to_stderr=False)
    console.print(table)
    missing = [i.name for i in infos if not i.available and i.name in SHORT_INSTALL_HINTS]
    for name in missing:
        console.print(f"{name}: {install_hint(name)}", markup=False)
    console.print("Your own loss: --backend package.module:callable", markup=False)


@app.command()
def presets(as_json: JsonOption = False) -> None:
    """List the built-in model presets (for --preset) and their LM-head shapes."""
    from rich.table import Table

    from fusedce_profiler.instrument.models.configs import PRESETS

    if as_json:
        sys.stdout.write(json.dumps({name: cfg.to_dict() for name, cfg in PRESETS.items()}, indent=2) + "\n")
        return
    table = Table(header_style="bold")
    for column in ("preset", "H", "V", "layers", "heads", "MLP width", "tied", "soft-cap"):
        table.add_column(column, justify="left" if column == "preset" else "right")
    for name, cfg in PRESETS.items():
        table.add_row(name, str(cfg.hidden_size), str(cfg.vocab_size), str(cfg.num_hidden_layers),
                      str(cfg.num_attention_heads), str(cfg.intermediate_size),
                      "yes" if cfg.tie_word_embeddings else "no",
                      "–" if cfg.final_logit_softcapping is None else f"{cfg.final_logit_softcapping:g}")
    make_console(to_stderr=False).print(table)


MODEL_COMMANDS = {"model": "fusedce_cli.model_command", "parity": "fusedce_cli.parity_command", "doctor": "fusedce_cli.doctor_command",
                  "explain": "fusedce_cli.explain_command"}
"""The commands that look at a whole training step, each defined in its own module under the
command's name."""


def _register_model_commands() -> None:
    """Register each of :data:`MODEL_COMMANDS` whose module exists."""
    for name, module_name in MODEL_COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # it exists but one of its imports is missing
                raise
            continue
        app.command(name)(getattr(module, name))


_register_model_commands()


def _whole_short_help() -> None:
    """The command list shows each command's first paragraph whole (click would cut it at ~45 characters)."""
    import inspect

    for info in app.registered_commands:
        if info.short_help is None and info.callback is not None:
            info.short_help = " ".join((inspect.getdoc(info.callback) or "").split("\n\n")[0].split())


_whole_short_help()
