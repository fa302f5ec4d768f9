"""``fusedce-profile`` (the default run) and ``fusedce-profile grid`` as Python functions.

>>> from fusedce_profile.grid import run_grid
>>> cells = run_grid(tokens=[256], vocab=[512], hidden=[64], backend=["torch", "fusedce"], mode=["fp32"],
...                  device="cpu", out="grid-run")
>>> [(c.spec.backend, c.status, c.peak_step_bytes) for c in cells]

Keyword arguments mirror the command's options (lists where an option takes several values);
``out`` is the run folder, written exactly as the command writes it (``results.jsonl``,
``plan.json``, ``environment.json``, ``results.csv``, ``summary.md``, ``report.html``,
``plots/``, ``logs/``). Each function returns the stored
:class:`~fusedce_profiler.instrument.records.CellResult` records. Bad input raises
:class:`~fusedce_profile.errors.UsageError` before anything is measured or written. Ctrl-C
(``KeyboardInterrupt``) stops the run: the finished cells are kept, the report of them is
written, and the interrupt propagates; ``resume=True`` with the same ``out`` measures only the
cells still missing. ``console``: a :class:`rich.console.Console` for the progress and the
summary the command prints (default: nothing is printed).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from fusedce_profile import arguments
from fusedce_profile.errors import UsageError
from fusedce_profile.outcome import CommandOutcome
from fusedce_profiler.instrument.text import one_line

DEFAULT_TOKENS = (1024, 4096, 16384)
DEFAULT_HEAD = (768, 32777)
"""(H, V) of a grid when neither the arguments nor a model name them."""


def _silent() -> Console:
    return Console(quiet=True)


def _names(values, option: str) -> tuple[str, ...] | None:
    """Names given as a list or one string, each may hold several, comma-separated; duplicates removed."""
    values = arguments.names(values, option)
    if values is None:
        return None
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{option}: give at least one value")
    return tuple(dict.fromkeys(names))


def grid_spec(*, tokens=None, batch=None, seq=None, vocab=None, hidden=None, backend=None, mode=None,
              device: str | None = None, bias: bool = False, ignore_frac=None, label_smoothing=None, z_loss=None,
              softcap=None, reduction: str = "mean", repeats: int = 5, warmup: int = 1, preset: str | None = None,
              config: str | Path | None = None, devices: Sequence[str] | None = None):
    """The validated :class:`~fusedce_profiler.grid.spec.GridSpec` of :func:`run_grid`'s arguments and the
    GPUs to spread it over; :class:`~fusedce_profile.errors.UsageError` for bad input (nothing runs)."""
    from fusedce_profile.checks import check_backends, check_grid_fits, resolve_device
    from fusedce_profile.defaults import installed_backends
    from fusedce_profile.heads import head_from
    from fusedce_profile.ranges import check_ranges
    from fusedce_profile.sources import backend_names
    from fusedce_profiler.grid.spec import GridSpec

    sizes = {name: arguments.listed(value, f"--{name}") for name, value in
             (("tokens", tokens), ("batch", batch), ("seq", seq), ("vocab", vocab), ("hidden", hidden))}
    options = {name: arguments.listed(value, "--" + name.replace("_", "-")) for name, value in
               (("ignore_frac", ignore_frac), ("label_smoothing", label_smoothing), ("z_loss", z_loss),
                ("softcap", softcap))}
    check_ranges("grid", **sizes, **options, repeats=repeats, warmup=warmup)
    arguments.flag(bias, "--bias")
    if tokens is not None and (batch is not None or seq is not None):
        raise UsageError("give --tokens, or --batch with --seq, not both")
    if (batch is None) != (seq is None):
        raise UsageError("--batch and --seq go together")
    arguments.model_options(preset, config)
    try:
        head = head_from(preset, None if config is None else Path(config))
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run_device = resolve_device(device)
    device_ids = _names(devices, "--devices")
    if device_ids is not None and run_device == "cpu":
        raise UsageError("--devices spreads cells over GPUs; the run's device is cpu "
                         "(drop --devices or use --device cuda)")
    named = backend_names(backend, model=False)
    check_backends(named or ())  # installed, importable: before any cell runs

    def ints(name: str) -> tuple[int, ...] | None:  # sorted, without repeats
        return None if sizes[name] is None else tuple(sorted(set(sizes[name])))

    def numbers(name: str, default: tuple) -> tuple:  # in the order given, without repeats
        given = options[name]
        return default if given is None else tuple(dict.fromkeys(None if v is None else float(v) for v in given))

    fields = dict(
        tokens=ints("tokens") or DEFAULT_TOKENS,
        vocab=ints("vocab") or ((head.vocab,) if head else (DEFAULT_HEAD[1],)),
        hidden=ints("hidden") or ((head.hidden,) if head else (DEFAULT_HEAD[0],)),
        backends=tuple(named or installed_backends(run_device)),
        modes=_names(mode, "--mode") or ("amp-bf16",),
        device=run_device,
        bias=(bool(bias),),
        ignore_frac=numbers("ignore_frac", (0.0,)),
        label_smoothing=numbers("label_smoothing", (0.0,)),
        z_loss=numbers("z_loss", (0.0,)),
        softcap=numbers("softcap", (head.softcap,) if head else (None,)),
        reduction=reduction,
        repeats=repeats,
        warmup=warmup,
    )
    if batch is not None:
        fields.update(batch=ints("batch"), seq=ints("seq"))
    try:
        spec = GridSpec(**fields)
        spec.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_grid_fits(spec, {
        "hidden": "--hidden" if hidden is not None else _head_entry(head, preset, config, "hidden_size"),
        "vocab": "--vocab" if vocab is not None else _head_entry(head, preset, config, "vocab_size")})
    return spec, device_ids


def _head_entry(head, preset: str | None, config, entry: str) -> str:
    """Where a grid's H or V came from when no option gave it: the model's ``entry``, or the default."""
    if head is None:
        return "the default " + {"hidden_size": "H", "vocab_size": "V"}[entry]
    return f"--preset {preset}: {entry}" if preset else f"--config {config}: {entry}"


def _run(grids, heading: str, *, out, force: bool, resume: bool, snapshot: bool, cell_timeout: float | None,
         devices, console: Console | None) -> CommandOutcome:
    from fusedce_profile.defaults import resolve_cell_timeout
    from fusedce_profile.folders import run_folder
    from fusedce_profile.grid_run import run_grids
    from fusedce_profile.ranges import check_ranges

    check_ranges("grid", cell_timeout=cell_timeout)
    arguments.flag(snapshot, "--snapshot")
    console = arguments.console(console) or _silent()
    device = grids[0].device
    timeout_s = resolve_cell_timeout(cell_timeout, device)
    with run_folder(arguments.path(out, "--out"), force=force, resume=resume, kind="grid") as out_dir:
        console.print(heading.replace("{out}", one_line(out_dir)), markup=False)
        if snapshot and device == "cpu":
            console.print("note: --snapshot records CUDA memory snapshots; the CPU run has none", markup=False)
        return run_grids(grids, out_dir, console, resume=resume, snapshot=snapshot, cell_timeout_s=timeout_s,
                         devices=devices)


def grid_command(*, out: str | Path | None = None, force: bool = False, resume: bool = False,
                 snapshot: bool = False, cell_timeout: float | None = None, console: Console | None = None,
                 **grid) -> CommandOutcome:
    """``fusedce-profile grid``: :func:`run_grid` with the exit code and ``--json`` summary the
    command line needs (a signal ends it with :attr:`CommandOutcome.stopped` set, not raised)."""
    from fusedce_profiler.instrument.text import count

    spec, devices = grid_spec(**grid)
    heading = f"fusedce-profile grid: {count(len(spec.cells()), 'cell')}, writing to {{out}}"
    return _run([spec], heading, out=out, force=force, resume=resume, snapshot=snapshot,
                cell_timeout=cell_timeout, devices=devices, console=console)


def default_command(*, device: str | None = None, preset: str | None = None, config: str | Path | None = None,
                    out: str | Path | None = None, force: bool = False, resume: bool = False,
                    snapshot: bool = False, cell_timeout: float | None = None,
                    console: Console | None = None) -> CommandOutcome:
    """``fusedce-profile`` with no command: :func:`run_default` with the exit code and ``--json`` summary."""
    from fusedce_profile.checks import check_grid_fits, resolve_device
    from fusedce_profile.defaults import default_run
    from fusedce_profile.heads import head_from
    from fusedce_profile.ranges import check_ranges

    arguments.model_options(preset, config)
    check_ranges("grid", cell_timeout=cell_timeout)  # before the CPU's bf16 probe (a second): bad input first
    try:
        head = head_from(preset, None if config is None else Path(config))
        run = default_run(resolve_device(device), heads=((head.hidden, head.vocab),) if head else None,
                          softcap=head.softcap if head else None)
        for spec in run.grids:
            spec.validate()
            check_grid_fits(spec, {"hidden": _head_entry(head, preset, config, "hidden_size"),
                                   "vocab": _head_entry(head, preset, config, "vocab_size")})
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    heading = f"fusedce-profile: {run.description}\nwriting to {{out}}"
    return _run(list(run.grids), heading, out=out, force=force, resume=resume, snapshot=snapshot,
                cell_timeout=cell_timeout, devices=None, console=console)


def run_grid(*, tokens: Sequence[int] | None = None, batch: Sequence[int] | None = None,
             seq: Sequence[int] | None = None, vocab: Sequence[int] | None = None,
             hidden: Sequence[int] | None = None, backend: Sequence[str] | None = None,
             mode: Sequence[str] | None = None, device: str | None = None, bias: bool = False,
             ignore_frac: Sequence[float] | None = None, label_smoothing: Sequence[float] | None = None,
             z_loss: Sequence[float] | None = None, softcap: Sequence[float | None] | None = None,
             reduction: str = "mean", repeats: int = 5, warmup: int = 1, preset: str | None = None,
             config: str | Path | None = None, out: str | Path | None = None, force: bool = False,
             resume: bool = False, snapshot: bool = False, devices: Sequence[str] | None = None,
             cell_timeout: float | None = None, console: Console | None = None) -> list:
    """Run a grid of back-ends × shapes × modes × options into ``out`` and write its report
    (``fusedce-profile grid``); returns the stored cell results.

    ``tokens`` (N = B·T), or ``batch`` with ``seq``; ``vocab`` (V) and ``hidden`` (H) default to
    ``preset``'s / ``config``'s head, else H=768, V=32777; ``backend``: built-in names or
    ``package.module:callable`` (default: every installed one but the opt-in fusedce points);
    ``mode``: ``amp-bf16`` (default), ``amp-fp16``, ``bf16``, ``fp32``; ``cell_timeout``: seconds
    after which a cell is recorded as ``timeout`` (default 900 on CUDA, 600 on the CPU; 0: none).
    """
    return grid_command(tokens=tokens, batch=batch, seq=seq, vocab=vocab, hidden=hidden, backend=backend,
                        mode=mode, device=device, bias=bias, ignore_frac=ignore_frac,
                        label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap, reduction=reduction,
                        repeats=repeats, warmup=warmup, preset=preset, config=config, devices=devices, out=out,
                        force=force, resume=resume, snapshot=snapshot, cell_timeout=cell_timeout,
                        console=console).records_or_raise()


def run_default(*, device: str | None = None, preset: str | None = None, config: str | Path | None = None,
                out: str | Path | None = None, force: bool = False, resume: bool = False, snapshot: bool = False,
                cell_timeout: float | None = None, console: Console | None = None) -> list:
    """The built-in default run (``fusedce-profile`` with no command; :mod:`fusedce_profile.defaults`),
    ``preset`` / ``config`` replacing its heads; returns the stored cell results."""
    return default_command(device=device, preset=preset, config=config, out=out, force=force, resume=resume,
                           snapshot=snapshot, cell_timeout=cell_timeout, console=console).records_or_raise()
