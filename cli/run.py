"""Run grids into a folder, build its report, print the summary, choose the exit code.

Shared by the default command and ``fusedce-profile grid``.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from cli import exit_codes
from cli.console import CellProgress, summary_tables
from cli.signals import interrupt_exit_code, stop_on_sigterm
from cli.usage import fail
from profiler import store
from profiler.grid import GridSpec
from profiler.runner import load_results, run_grid
from reports import Report, build_report


def print_report(report: Report, console: Console) -> None:
    """The terminal summary: the table, the findings, where the report is."""
    for table in summary_tables(report.frame) if not report.frame.empty else []:
        console.print(table)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    for finding in report.findings:  # stored strings are escaped: only our own markup is markup
        scope = f"[bold]{escape(finding.scope)}[/]: " if finding.scope else ""
        console.print(f"• {scope}{escape(finding.text)}", markup=True, highlight=False)
    console.print(f"\nReport: [bold]{escape(str(report.summary))}[/] (Markdown), "
                  + escape(f"{report.html} (HTML), {report.csv} (CSV), plots in {report.run_dir / 'plots'}"),
                  markup=True)


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
        "exit_code": exit_code,
        "findings": [{"topic": f.topic, "scope": f.scope, "text": f.text} for f in report.findings],
        "rows": rows,
    }


def finish(out_dir: Path, console: Console, *, as_json: bool) -> int:
    """Build the report of ``out_dir``, print it (or its JSON), return the exit code."""
    report = build_report(out_dir)
    code = exit_codes.PARITY_FAILED if report.parity_failed else exit_codes.OK
    print_report(report, console)
    if report.parity_failed:
        console.print("[bold red]A parity check failed its tolerance: exit code 1.[/]", markup=True)
    if as_json:
        sys.stdout.write(json.dumps(json_summary(report, code), indent=2) + "\n")
    return code


def run_grids(grids: Sequence[GridSpec], out_dir: Path, console: Console, *, resume: bool, snapshot: bool,
              as_json: bool, cell_timeout_s: float | None = None) -> int:
    """Run ``grids`` one after the other into ``out_dir`` (one results file), then report.

    The folder is locked for the run (a second run into it exits 2 naming the holder).
    Ctrl-C or SIGTERM stops the run; the cells finished so far are kept and reported, and
    the exit code is 130 or 143.
    """
    try:
        lock = store.RunLock(out_dir).acquire()
    except store.FolderInUse as exc:
        raise fail(str(exc)) from None
    stopped: KeyboardInterrupt | None = None
    try:
        finished = {r.spec.key() for r in load_results(out_dir).records} if resume else set()
        total = len({spec.key() for grid in grids for spec in grid.cells()} - finished)
        progress = CellProgress(console, total)
        try:
            with stop_on_sigterm(), progress.running():
                for index, grid in enumerate(grids):
                    # Later grids append to the same results file: they resume it.
                    run = run_grid(grid, out_dir, resume=resume or index > 0, snapshot=snapshot,
                                   on_start=progress.start, on_cell=progress, cell_timeout_s=cell_timeout_s)
                    for note in run.notes:
                        console.print(f"note: {note}", markup=False)
        except KeyboardInterrupt as exc:
            stopped = exc
            console.print(f"\nInterrupted after {progress.done} of {total} new cells; continue with "
                          f"--resume --out {out_dir}", markup=False)
        if not (out_dir / store.ENVIRONMENT_FILE).exists():
            from profiler.environment import collect_environment, save_environment

            save_environment(out_dir, collect_environment())
        if not (out_dir / store.RESULTS_FILE).exists():
            console.print("No cell finished: nothing to report.", markup=False)
            return interrupt_exit_code(stopped) if stopped else exit_codes.OK
        code = finish(out_dir, console, as_json=as_json)
        return interrupt_exit_code(stopped) if stopped else code
    finally:
        lock.release()
