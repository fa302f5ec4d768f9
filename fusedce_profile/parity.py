"""``fusedce-profile parity`` as a Python function: train from the same initialisation on the same
batches with torch and each back-end, and judge each against torch.

>>> from fusedce_profile.parity import parity
>>> report = parity(preset="tiny", backend=["fusedce"], steps=20, batch=2, seq=16, device="cpu", out="parity-run")
>>> report.passed, [(v.backend, v.passed) for v in report.verdicts]

Keyword arguments mirror the command's options; ``out`` is the run folder, written as the command
writes it (``parity.json``, ``environment.json``, ``summary.md``, ``plots/parity_loss.png``).
Returns the stored :class:`~fusedce_profiler.judgements.parity.ParityReport`. The report is saved
after each back-end: Ctrl-C (``KeyboardInterrupt``) keeps the back-ends that finished, writes their
report marked *interrupted*, and propagates; ``resume=True`` with the same ``out`` and options keeps
the back-ends trained and trains the rest.

Each curve trains in a worker process (one serves every curve while none fails): a back-end that
raises, calls ``sys.exit`` or ``os._exit``, hangs past :data:`CURVE_TIMEOUT_S` or grows past the
memory limit (three quarters of the machine's memory) ends its own curve as an ``error`` — the run,
its report and the other back-ends go on.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from fusedce_profile import arguments, exit_codes
from fusedce_profile.errors import UsageError
from fusedce_profile.outcome import CommandOutcome
from fusedce_profiler.instrument.text import count, one_line, resume_option, same_command_resumed


def parity_settings(*, preset=None, config=None, tied=None, backend: Sequence[str] | None = None, steps=300,
                    batch=8, seq=64, lr=3e-3, reduction="mean", bias=False, ignore_frac=0.0, loss_tol=0.02,
                    control=True, seed=0, device=None, mode=None):
    """The checked :class:`~fusedce_profiler.judgements.parity.ParitySettings` of :func:`parity`'s
    arguments; bad input raises :class:`~fusedce_profile.errors.UsageError` (nothing runs)."""
    from fusedce_profile.checks import check_backends, check_model_fits, resolve_device
    from fusedce_profile.ranges import check_ranges
    from fusedce_profile.sources import loss_backends, model_config
    from fusedce_profiler.instrument import capacity
    from fusedce_profiler.judgements.parity import ParitySettings

    check_ranges("parity", steps=steps, batch=batch, seq=seq, lr=lr, ignore_frac=ignore_frac, loss_tol=loss_tol,
                 seed=seed)
    for value, option in ((bias, "--bias"), (control, "--control")):
        arguments.flag(value, option)
    arguments.flag(tied, "--tied", optional=True)
    run_device = resolve_device(device)
    cfg = model_config(preset, config, tied, "tiny")
    compared = loss_backends(backend, ["fusedce"])[1:]
    if not compared:
        raise UsageError("parity compares back-ends with torch: give at least one --backend other than torch")
    check_backends(compared)
    too_much = capacity.parity_problem(len(compared) + 1 + bool(control), steps)  # torch and the control too
    if too_much:
        raise UsageError(too_much)
    check_model_fits(cfg, run_device, batch, seq)
    try:
        return ParitySettings(
            config=cfg, backends=compared, steps=steps, batch=batch, seq=seq, lr=lr, device=run_device,
            mode=mode or ("amp-bf16" if run_device.startswith("cuda") else "fp32"), reduction=reduction, bias=bias,
            ignore_frac=ignore_frac, loss_tolerance=loss_tol, seed=seed, control=control)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _print_result(result, say, out_dir: Path) -> None:
    from fusedce_profiler.instrument.worker_errors import logs_named_from
    from fusedce_reports.parity_report import gap_sentences, parity_table

    for row in parity_table(result).itertuples(index=False):  # a worker's log named from where the command runs
        say(f"  {row[0]}: {row[1]}, final loss {row[2]}, rel. diff {row[3]}, worst grad {row[5]}"
            + (f" — {logs_named_from(row[6], out_dir)}" if row[6] else ""))
    for sentence in gap_sentences(result):
        say(f"  {sentence}")


def _finished(out_dir: Path, settings):
    """The stored report a resumed run continues (``None`` when the folder has none); a report of
    other settings is refused: its curves are not this run's."""
    from fusedce_profiler.instrument import store
    from fusedce_profiler.judgements.parity import load_parity_report

    if not (out_dir / store.PARITY_FILE).is_file():
        return None
    try:
        finished = load_parity_report(out_dir)
    except ValueError as exc:
        raise UsageError(f"--resume: {exc}") from None
    if finished.settings != settings:
        raise UsageError(f"--resume: the run in {out_dir} was made with other options; give the same options, "
                         "or --force to start again")
    return finished


CURVE_TIMEOUT_S = 3600.0
"""Seconds one curve may train (a hang ends there): far above a real curve (300 steps of the tiny
preset take seconds on a CPU, the user's model minutes on a GPU)."""


def _curve_of(label: str, curve):
    """The parity-curve job's reply, when it is the curve of ``label`` (``ValueError`` otherwise)."""
    if curve.backend != label:
        raise ValueError(f"it is the curve of another back-end ({curve.backend})")
    return curve


class _CurveTrainer:
    """``train(name, perturbed)`` for :func:`~fusedce_profiler.judgements.parity_training.run_parity`: each curve
    trained by the ``parity-curve`` job of a worker; a worker that dies (an exit, a hang, runaway
    memory) gives that curve status ``error`` naming why, and the next curve a fresh worker."""

    def __init__(self, settings, log_dir: Path) -> None:
        from fusedce_profiler.instrument.worker import default_max_rss_bytes

        self.settings, self.log_dir = settings, log_dir
        self.max_rss_bytes = default_max_rss_bytes()
        self.worker = None

    def __call__(self, name: str, perturbed: bool):
        from fusedce_profiler.instrument.callables import user_backend
        from fusedce_profiler.instrument.schema import build
        from fusedce_profiler.instrument.worker import JobFailed, Worker, WorkerDied, run_stopped_by
        from fusedce_profiler.judgements.parity import CONTROL, ParityCurve

        label = CONTROL if perturbed else name
        payload = {"settings": dataclasses.asdict(self.settings), "backend": name, "perturbed": perturbed}
        tenant = user_backend(name)
        try:
            self.worker = Worker.kept_for(self.worker, tenant)  # a user back-end's worker trains its curves alone
            if self.worker is None:
                self.worker = Worker(self.log_dir, preload=("parity-curve",),
                                     warm_up=("fusedce_profiler.judgements.parity_training:warm_up_training",))
            return self.worker.call("parity-curve", payload, timeout_s=CURVE_TIMEOUT_S, max_rss_bytes=self.max_rss_bytes,
                                    read=lambda raw: _curve_of(label, build(ParityCurve, raw)), tenant=tenant)
        except WorkerDied as died:
            if died.at_start:  # no later curve could run either (the command line's one line, exit 3)
                raise run_stopped_by(died) from None
            self.close()
            # the worker's own account (an exit code, the memory limit it grew past); a hang's names its limit
            why = (f"did not finish within {CURVE_TIMEOUT_S:g} s (a hang?); the worker was stopped" if died.timed_out
                   else died.summary_in(self.log_dir.parent))  # the log named within the run folder
            return ParityCurve(label, status="error", message=why)
        except JobFailed as failed:  # raised before training could turn it into a result
            return ParityCurve(label, status="error", message=failed.summary_in(self.log_dir.parent))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def parity_command(*, out: str | Path | None = None, force: bool = False, resume: bool = False,
                   console: Console | None = None, **options) -> CommandOutcome:
    """``fusedce-profile parity``: :func:`parity` with the exit code and ``--json`` summary the command
    line needs (a signal ends it with :attr:`CommandOutcome.stopped` set, not raised)."""
    from fusedce_profile.folders import report_errors, run_folder
    from fusedce_profile.interruption import interrupted_outcome, report_stopped
    from fusedce_profile.signals import interrupt_exit_code
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.environment import collect_environment, save_environment
    from fusedce_profiler.instrument.interruption import clear_interruption
    from fusedce_profiler.judgements.parity import load_parity_report, save_parity_report
    from fusedce_profiler.judgements.parity_training import ReferenceFailed, run_parity
    from fusedce_reports.parity_report import write_parity_report

    settings = parity_settings(**options)
    console = arguments.console(console) or Console(quiet=True)

    def say(line: str) -> None:
        console.print(line, markup=False)

    with run_folder(arguments.path(out, "--out"), force=force, resume=resume, kind="parity") as out_dir:
        finished = _finished(out_dir, settings) if resume else None
        say(f"fusedce-profile parity: {settings.config.name}, {settings.steps} steps, {settings.mode} on "
            f"{settings.device}, seed {settings.seed}; writing to {one_line(out_dir)}")
        clear_interruption(out_dir)
        if finished is None or not (out_dir / store.ENVIRONMENT_FILE).is_file():
            save_environment(out_dir, collect_environment())

        def keep(partial) -> None:  # after each back-end: a run cut short keeps what it trained
            if (out_dir / store.PARITY_FILE).is_file():
                refused = report_errors(out_dir, "the curves trained before")
            else:  # the first to be stored: nothing is kept yet
                refused = report_errors(out_dir, "no curves",
                                        f"the same command with {resume_option(out_dir)} trains them")
            with refused:
                save_parity_report(out_dir, partial)
            with contextlib.suppress(OSError):  # a page that cannot be written is said once, at the end
                write_parity_report(out_dir)

        again = same_command_resumed(out_dir)
        trainer = _CurveTrainer(settings, out_dir / store.LOGS_DIR)
        try:
            result = run_parity(settings, progress=lambda name: say(f"  training with {name} ..."), on_curve=keep,
                                finished=finished, train=trainer)
        except ReferenceFailed as exc:  # a failed run, not bad input: nothing could be judged
            say(f"parity: FAIL, nothing judged: {one_line(exc)}; logs in {one_line(out_dir / store.LOGS_DIR)}")
            return CommandOutcome([], exit_codes.PARITY_FAILED, {"out": str(out_dir), "passed": False,
                                                                 "error": str(exc)})
        except KeyboardInterrupt as stopped:
            if not (out_dir / store.PARITY_FILE).is_file():
                say(f"\nInterrupted before the first comparison finished: nothing to report; continue with {again}")
                code = interrupt_exit_code(stopped)
                return CommandOutcome([], code, {"out": str(out_dir), "exit_code": code}, stopped)
            partial = load_parity_report(out_dir)
            trained = len(settings.backends) - len(partial.not_run)
            return interrupted_outcome(out_dir, stopped, [partial], f"{trained} of {len(settings.backends)} back-ends",
                                       again, write_parity_report, say)
        finally:
            trainer.close()
        try:
            with report_errors(out_dir, "the trained curves"):
                save_parity_report(out_dir, result)
                write_parity_report(out_dir)
        except KeyboardInterrupt as stopped:
            return report_stopped(out_dir, stopped, [result], count(len(result.curves), "curve"), say)
    _print_result(result, say, out_dir)
    if not result.reference_learned:
        say("  torch did not learn on this data: raise --steps or --lr")
    say(f"parity: {'PASS' if result.passed else 'FAIL'}; report: {one_line(out_dir / 'summary.md')}")
    code = exit_codes.OK if result.passed else exit_codes.PARITY_FAILED
    summary = {"out": str(out_dir), "passed": result.passed,
               "verdicts": [dataclasses.asdict(v) for v in result.verdicts]}
    return CommandOutcome([result], code, summary)


def parity(*, preset: str | None = None, config: str | Path | None = None, tied: bool | None = None,
           backend: Sequence[str] | None = None, steps: int = 300, batch: int = 8, seq: int = 64, lr: float = 3e-3,
           reduction: str = "mean", bias: bool = False, ignore_frac: float = 0.0, loss_tol: float = 0.02,
           control: bool = True, seed: int = 0, device: str | None = None, mode: str | None = None,
           out: str | Path | None = None, force: bool = False, resume: bool = False, console: Console | None = None):
    """Train the built-in model (``preset`` / ``config``, default ``tiny``) ``steps`` AdamW steps with
    torch and each ``backend`` (default fusedce) from the same initialisation on the same batches, and
    judge each against torch (``loss_tol``: allowed relative difference of the final loss; ``control``:
    first train torch from weights moved by one rounding, the run's noise floor). Returns the stored
    :class:`~fusedce_profiler.judgements.parity.ParityReport` (``passed`` is the verdict); raises
    :class:`~fusedce_profiler.judgements.parity_training.ReferenceFailed` when torch's own curve did not train."""
    outcome = parity_command(preset=preset, config=config, tied=tied, backend=backend, steps=steps, batch=batch,
                             seq=seq, lr=lr, reduction=reduction, bias=bias, ignore_frac=ignore_frac,
                             loss_tol=loss_tol, control=control, seed=seed, device=device, mode=mode, out=out,
                             force=force, resume=resume, console=console)
    records = outcome.records_or_raise()
    if not records:
        from fusedce_profiler.judgements.parity_training import ReferenceFailed

        raise ReferenceFailed(outcome.summary["error"])
    return records[0]
