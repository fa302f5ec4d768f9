"""Run grids into a folder, build its report, print the summary, choose the exit code.

Shared by :func:`fusedce_profile.grid.run_grid`, :func:`fusedce_profile.grid.run_default` and
:func:`fusedce_profile.report.build_report` (a grid folder). Everything printed goes to the
``console`` the caller gives (a silent one for a Python caller that gives none).
"""
from __future__ import annotations

import errno
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fusedce_profile import exit_codes
from fusedce_profile.console import CellProgress, Printer, error, summary_tables
from fusedce_profile.errors import UsageError
from fusedce_profile.folders import check_appendable, describe_os_error, os_errors, report_errors
from fusedce_profile.interruption import report_stopped
from fusedce_profile.outcome import CommandOutcome
from fusedce_profile.signals import interrupt_exit_code, signal_name
from fusedce_profiler.instrument import staging, store
from fusedce_profiler.instrument.confined import FolderRefused
from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.instrument.records import CellSpec
from fusedce_profiler.instrument.text import count, one_line, resume_option, same_command_resumed, shell_word
from fusedce_profiler.grid.plan import planned_cells_and_timing, save_plan
from fusedce_profiler.instrument.planned import changed_settings, dropped_unfinished
from fusedce_profiler.grid.runner import ResultNotStored, run_grid
from fusedce_profiler.instrument.records import load_results
from fusedce_profiler.instrument.records import FAILED_STATUSES, CellResult
from fusedce_profiler.instrument.worker import WorkerDied
from fusedce_profiler.instrument.worker_errors import logs_named_from
from fusedce_reports import Report, build_report

def print_report(report: Report, console: Console) -> None:
    """The terminal summary: the table, the findings, where the report is."""
    for table in summary_tables(report.frame) if not report.frame.empty else []:
        console.print(table)
    for note in report.notes:  # each one line: a stored name's newline cannot forge a line of the output
        console.print(f"note: {one_line(note)}", markup=False)
    for finding in report.findings:  # stored strings are escaped: only our own markup is markup
        scope = f"[bold]{escape(finding.scope)}[/]: " if finding.scope else ""
        text = logs_named_from(finding.text, report.run_dir)  # a worker's log, named from where this runs
        console.print(f"• {scope}{escape(text)}", markup=True, highlight=False)
    console.print(f"\nReport: [bold]{escape(one_line(report.summary))}[/] (Markdown), "
                  + escape(f"{one_line(report.html)} (HTML), {one_line(report.csv)} (CSV), "
                           f"plots in {one_line(report.run_dir / 'plots')}"),
                  markup=True)


def failed_backends(report: Report) -> list[tuple[str, int]]:
    """(back-end, cells) of each back-end that failed in every one of its cells."""
    frame = report.frame
    if frame.empty:
        return []
    failed = []
    for backend, statuses in frame.groupby("backend", sort=False)["status"]:
        if statuses.isin(FAILED_STATUSES).all():
            failed.append((str(backend), len(statuses)))
    return failed


def _cell_name(spec: CellSpec) -> str:
    return f"{spec.backend} at {spec.tokens} tokens (H={spec.hidden} V={spec.vocab}, {spec.mode})"


def json_summary(report: Report, exit_code: int) -> dict:
    """The machine-readable summary printed by ``--json``."""
    frame = report.frame
    columns = ["backend", "tokens", "hidden", "vocab", "mode", "device", "options", "status", "peak_bytes",
               "floor_bytes", "predicted_bytes", "x_floor", "saving_bytes", "saving_frac", "time_ms",
               "worst_error", "tolerance", "parity_ok"]
    rows = json.loads(frame.reindex(columns=columns).to_json(orient="records")) if not frame.empty else []
    return {
        "out_dir": str(report.run_dir),
        "summary_md": str(report.summary),
        "report_html": str(report.html),
        "results_csv": str(report.csv),
        "plots": [str(p) for p in [*report.plots.values(), *report.timelines]],
        "cells": {"total": len(frame), **{k: int(v) for k, v in frame["status"].value_counts().items()}}
        if not frame.empty else {"total": 0},
        "notes": report.notes,
        "parity_failed": report.parity_failed,
        "failed_backends": [name for name, _ in failed_backends(report)],
        "exit_code": exit_code,
        "findings": [{"topic": f.topic, "scope": f.scope, "text": f.text} for f in report.findings],
        "rows": rows,
    }


def finish(out_dir: Path, console: Printer, *, stopped: KeyboardInterrupt | None = None,
           after_run: bool = True, start_failed: bool = False) -> CommandOutcome:
    """Build the report of ``out_dir``, print it, and say what the run came to: its records, the
    exit code (1 when a parity check failed or a back-end failed in every one of its cells; 130/143
    when the run was ``stopped`` by a signal, whatever else; 3 when it stopped because a worker could
    not start, ``start_failed``: what could not run outweighs a check of what did) and the ``--json`` summary.
    ``after_run``: a grid run just stored the cells (a failure then says they are kept and how to
    report them); ``False`` for ``report`` of a folder, whose failure is only its own line.
    """
    placed = None
    errors = report_errors(out_dir, "the finished cells") if after_run else os_errors()
    try:
        with errors, staging.all_or_nothing() as placed:  # all, or none
            report = build_report(out_dir)
    except KeyboardInterrupt as late:  # a signal while the report was being written
        if placed is not None and placed.done:  # it came as the files were put in place: the report is whole
            stopped = stopped or late
        elif stopped is None:
            raise  # the first signal, the report's files left as they were: the caller's to handle
        else:  # a second signal while a stopped run's report was being written
            code = interrupt_exit_code(stopped)
            console.print(f"report interrupted; its files were not replaced (the finished cells are kept): run "
                          f"`fusedce-profile report {shell_word(out_dir)}` to write it", markup=False)
            return CommandOutcome(stored_cells(out_dir), code, {"interrupted": signal_name(stopped), "exit_code": code},
                                  stopped)
    broken = failed_backends(report)
    code = exit_codes.CHECK_FAILED if report.parity_failed or broken else exit_codes.OK
    if stopped is not None:
        code = interrupt_exit_code(stopped)
    elif start_failed:
        code = exit_codes.RUN_FAILED
    try:
        print_report(report, console)
        verdict = f": exit code {code}" if code == exit_codes.CHECK_FAILED else ""  # another outcome decides it
        if report.parity_failed:
            console.print(f"[bold red]A parity check failed its tolerance{verdict}.[/]", markup=True)
        for backend, cells in broken:
            console.print(f"[bold red]{backend} failed in every cell ({cells} of {cells}){verdict}.[/]",
                          markup=True, highlight=False)
    except KeyboardInterrupt as late:  # as the report, already whole in the folder, was printed
        stopped = stopped or late
        code = interrupt_exit_code(stopped)
        console.print(f"\nStopped by {signal_name(late)} as the report was printed; its files are whole", markup=False)
    return CommandOutcome(stored_cells(out_dir), code, json_summary(report, code), stopped)


def stored_cells(out_dir: Path) -> list[CellResult]:
    """The cell results stored in ``out_dir`` (``results.jsonl``), in the order they finished."""
    with os_errors():
        return list(load_results(out_dir).records)


def _check_same_plan(out_dir: Path, planned: list[CellSpec], rows: list[CellResult], timing: dict) -> dict:
    """``UsageError`` when ``--resume`` would drop cells the folder's run set out to measure
    (``plan.json``) and has not finished: a resume given other options than the run it continues
    would measure another grid into that folder and leave the first one unfinished. A plan that
    adds cells, or leaves out finished ones, is allowed; another ``timing`` (warm-up, repeats) beside
    the finished ``rows`` is not: one table would hold cells timed two ways, and no row says which.
    The repeats are told by the rows themselves (one time each), the warm-up by ``plan.json`` alone.
    Returns the timing to store with the new plan: ``timing``, less what no record tells of the
    finished cells (a plan stored without it, or removed)."""
    finished = {row.spec.key() for row in rows}
    try:
        stored, stored_timing = planned_cells_and_timing(out_dir) or (None, None)
    except ValueError as exc:  # what the first run set out to measure is unknown: replaced only when asked
        raise UsageError(f"--resume: {one_line(exc)}; remove that file to resume with this command's grid") from None
    timed = sorted({len(row.times_ms) for row in rows if row.status == "ok" and row.times_ms})
    told = dict(stored_timing or {}) if rows else dict(timing)  # nothing finished: nothing timed otherwise
    if len(timed) == 1:  # the rows' own count wins over what the plan says
        told["repeats"] = timed[0]
    changed = changed_settings(told, timing)
    if len(timed) > 1:
        changed.append(f"repeats {', '.join(map(str, timed))} already, now {timing['repeats']}")
    dropped = dropped_unfinished(stored, planned, finished)
    if dropped:
        raise UsageError(f"--resume: {one_line(out_dir)} holds a run planned with other cells ({len(dropped)} "
                         f"unfinished of its {len(stored)} are not in this command's grid, e.g. "
                         f"{_cell_name(dropped[0])}); give the options of the command that started it")
    if changed:
        raise UsageError(f"--resume: the cells in {one_line(out_dir)} were timed with other settings "
                         f"({'; '.join(changed)}); give the --warmup and --repeats of the command that started it")
    return {name: value for name, value in timing.items() if name in told}


def run_grids(grids: Sequence[GridSpec], out_dir: Path, console: Console, *, resume: bool, snapshot: bool,
              cell_timeout_s: float | None = None, devices: Sequence[str] | None = None) -> CommandOutcome:
    """Run ``grids`` one after the other, in one worker, into ``out_dir`` (one results file), then report.

    The folder is locked for the run (a second run into it is refused naming the holder), and
    the cells it plans are stored first (``plan.json``: the report of a cut run says how many
    are missing). Ctrl-C or SIGTERM stops the run; the cells finished so far are kept and
    reported, and the exit code is 130 or 143. A result that cannot be written (a full disk,
    a file-size limit) raises :class:`~fusedce_profile.errors.UsageError` naming the path, the OS
    error and the cell ``--resume`` measures again; a worker that cannot start stops the run with
    exit code 3.
    ``cell_timeout_s``: a cell still running after that long is recorded as ``timeout``.
    ``devices``: see :func:`fusedce_profiler.grid.runner.run_grid`.
    """
    try:
        lock = store.RunLock(out_dir).acquire()
    except store.FolderInUse as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out {describe_os_error(exc)}") from None
    stopped: KeyboardInterrupt | None = None
    start_failed: str | None = None  # why the run stopped: a worker could not start
    try:
        planned = list({spec.key(): spec for grid in grids for spec in grid.cells()}.values())
        with os_errors():
            rows = list(load_results(out_dir).records) if resume else []
            finished = {r.spec.key() for r in rows}
            timing = {"warmup": grids[0].warmup, "repeats": grids[0].repeats}  # the grids share one (run_grid)
            if resume:
                timing = _check_same_plan(out_dir, planned, rows, timing)
                check_appendable(out_dir / store.RESULTS_FILE)  # before the plan is replaced
            save_plan(out_dir, planned, timing)
        total = len({spec.key() for spec in planned} - finished)
        progress = CellProgress(console, total, out_dir)
        try:
            with progress.running():
                # One call: the grids share a worker (one start-up, one CUDA context, warm caches).
                run = run_grid(grids, out_dir, resume=resume, snapshot=snapshot, on_start=progress.start,
                               on_cell=progress, cell_timeout_s=cell_timeout_s, devices=devices)
                for note in run.notes:
                    console.print(f"note: {one_line(note)}", markup=False)
        except KeyboardInterrupt as exc:
            stopped = exc
            console.print(f"\nInterrupted after {progress.done} of {count(total, 'new cell')}; continue with "
                          f"{same_command_resumed(out_dir)}", markup=False)
        except ResultNotStored as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            raise UsageError(f"{describe_os_error(exc)}: the result of {_cell_name(exc.spec)} was not stored; "
                             f"{'free space (or raise the limit)' if full else 'fix that'} and run with "
                             f"{resume_option(out_dir)}: it measures that cell again") from None
        except WorkerDied as died:  # at start-up: every cell would fail the same way
            start_failed = f"{died.summary}; the run stopped after {progress.done} of {count(total, 'new cell')}"
            if not getattr(console, "quiet", False):  # a Python caller's quiet console: raised, not printed
                error(start_failed)
        except OSError as exc:
            raise UsageError(describe_os_error(exc)) from None
        except FolderRefused as exc:  # a link or an oversized file met while resuming
            raise UsageError(str(exc)) from None
        with os_errors():
            if not (out_dir / store.ENVIRONMENT_FILE).exists():
                from fusedce_profiler.instrument.environment import collect_environment, save_environment

                save_environment(out_dir, collect_environment())
        if not (out_dir / store.RESULTS_FILE).exists():
            console.print("No cell finished: nothing to report.", markup=False)
            code = interrupt_exit_code(stopped) if stopped else \
                exit_codes.RUN_FAILED if start_failed else exit_codes.OK
            return CommandOutcome([], code, {}, stopped, start_failed)
        try:
            outcome = finish(out_dir, console, stopped=stopped, start_failed=start_failed is not None)
        except KeyboardInterrupt as late:  # after the last cell, while the report was written
            cells = stored_cells(out_dir)
            return report_stopped(out_dir, late, cells, count(len(cells), "cell"),
                                  lambda line: console.print(line, markup=False))
        except UsageError as unwritten:  # the report met what stopped the run (no descriptor left, say)
            if start_failed is None:
                raise
            if not getattr(console, "quiet", False):
                error(str(unwritten))
            outcome = CommandOutcome([], exit_codes.RUN_FAILED, {"exit_code": exit_codes.RUN_FAILED})
        outcome.failure = start_failed
        return outcome
    finally:
        lock.release()
