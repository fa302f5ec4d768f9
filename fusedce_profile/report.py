"""``fusedce-profile report DIR`` as a Python function: rebuild a run folder's report from its
stored files alone (no GPU; only JSON and CSV files are read, so a folder from someone else
cannot run code).

>>> from fusedce_profile.report import build_report
>>> records = build_report("grid-run")      # the folder run_grid, profile_model, parity, … wrote

The folder's kind is told by the file it holds: ``results.jsonl`` (a grid), ``model_results.jsonl``
(``model``), ``parity.json``, ``doctor.json``, ``recorded_steps.jsonl`` (steps recorded in your own
run) or ``explain.json``. Returns the typed records the folder stores (cell results, model results,
the parity or doctor report, recorded steps, the explanation). A path that is not such a folder,
or a damaged stored file, raises :class:`~fusedce_profile.errors.UsageError`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from fusedce_profile import arguments, exit_codes
from fusedce_profile.errors import UsageError
from fusedce_profile.folders import held_for_report, in_use_for_report, os_errors
from fusedce_profile.outcome import CommandOutcome
from fusedce_profile.signals import interrupt_exit_code, signal_name
from fusedce_profiler.instrument.text import one_line, shell_word
from fusedce_profiler.instrument.kinds import RESULT_RECORDS
from fusedce_profiler.instrument.runlock import live_holder

if TYPE_CHECKING:
    from fusedce_profile.console import Printer


def _plots(run_dir: Path) -> list[str]:
    from fusedce_profiler.instrument import store

    return sorted(str(p) for p in (run_dir / store.PLOTS_DIR).glob("*.png"))


def _checked(kind: str, run_dir: Path, console: Printer) -> CommandOutcome:
    """A ``model``, ``parity`` or ``doctor`` folder (``kind``) rebuilt; exit code 1 when its check failed."""
    from fusedce_profiler.instrument.step.jobs import load_model_results
    from fusedce_reports.doctor_report import read_doctor, write_doctor_report
    from fusedce_reports.model_report import missing_rows, write_model_report
    from fusedce_reports.parity_report import write_parity_report

    passed, notes = None, []
    if kind == "model":
        loaded = load_model_results(run_dir)
        summary = write_model_report(run_dir)
        notes = missing_rows(loaded.records) + loaded.problems
        records = list(loaded.records)
    elif kind == "parity":
        summary, parity_report = write_parity_report(run_dir)
        passed, records = parity_report.passed, [parity_report]
    else:
        summary = write_doctor_report(run_dir)
        doctor_run = read_doctor(run_dir)
        records = [doctor_run]
        if doctor_run.interrupted:  # stopped before its verdict: neither a pass nor a failure, as its page says
            notes = ["the doctor run was interrupted before its verdict (no verdict): run the same doctor command with --force"]
        else:
            passed = doctor_run.passed
    for note in notes:
        console.print(f"incomplete run: {note}", markup=False)
    if passed is not None:
        console.print(f"{kind}: {'PASS' if passed else 'FAIL'}", markup=False)
    console.print(f"report: {summary}", markup=False)
    code = exit_codes.CHECK_FAILED if passed is False else exit_codes.OK
    return CommandOutcome(records, code, {
        "summary": str(summary), "incomplete": notes,
        "parity_passed": passed if kind == "parity" else None,
        "doctor_passed": passed if kind == "doctor" else None, "exit_code": code})


def _recorded(run_dir: Path, console: Printer) -> CommandOutcome:
    """A folder of steps recorded in the user's own run, rebuilt (exit code 0)."""
    from fusedce_profiler.instrument.recording.records import load_recorded_steps
    from fusedce_reports.recorded_report import write_recorded_report

    loaded = load_recorded_steps(run_dir)
    summary = write_recorded_report(run_dir)
    for problem in loaded.problems:
        console.print(f"incomplete run: {problem}", markup=False)
    console.print(f"report: {summary} ({len(loaded.records)} recorded step(s))", markup=False)
    return CommandOutcome(list(loaded.records), exit_codes.OK, {
        "summary": str(summary), "steps": len(loaded.records),
        "incomplete": loaded.problems, "exit_code": exit_codes.OK})


def _explained(run_dir: Path, console: Printer) -> CommandOutcome:
    from fusedce_profiler.judgements.explain.records import load_explanation
    from fusedce_reports.explain_report import write_explain_report

    console.print(f"report: {write_explain_report(run_dir)}", markup=False)
    return CommandOutcome([load_explanation(run_dir)], exit_codes.OK)


class _HeldLines:
    """What a rebuilt report prints (``print`` calls, as to a rich ``Console``), held until its files
    are in place and then said: a line naming the new report never comes before the report exists,
    and a report that could not be put in place prints only the line that says why."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def print(self, *objects, **options) -> None:
        self.calls.append((objects, options))

    def say(self, console: Console) -> None:
        for objects, options in self.calls:
            console.print(*objects, **options)


def _rebuilt(run_dir: Path, console: Printer) -> tuple[str, CommandOutcome] | None:
    """The kind of folder ``run_dir`` is and its report rebuilt; ``None`` when it is none."""
    from fusedce_profile.grid_run import finish
    from fusedce_profiler.instrument import store

    def present(name: str) -> bool:
        return store.present(run_dir / name)

    found = [name for name in RESULT_RECORDS if present(name)]  # in the order below: the first is reported
    if len(found) > 1:
        console.print(f"note: {one_line(run_dir)} holds the records of more than one run ({', '.join(found)}); "
                      f"only {found[0]}'s is reported: give each run a folder of its own", markup=False)
    if present(store.RESULTS_FILE):
        return "grid", finish(run_dir, console, after_run=False)
    for kind, name in (("model", store.MODEL_RESULTS_FILE), ("parity", store.PARITY_FILE),
                       ("doctor", store.DOCTOR_FILE)):
        if present(name):
            return kind, _checked(kind, run_dir, console)
    if present(store.RECORDED_STEPS_FILE):
        return "recorded", _recorded(run_dir, console)
    if present(store.EXPLAIN_FILE):
        return "explain", _explained(run_dir, console)
    return None


_RUN_KINDS = "give the folder a grid, model, parity, doctor, explain or recorded run wrote"
"""The hint of both refusals of a folder that holds no run."""


def _no_records(run_dir: Path) -> UsageError:
    *most, last = RESULT_RECORDS
    return UsageError(f"{run_dir}: no {', '.join(most)} or {last} here ({_RUN_KINDS})")


def report_command(run_dir: str | Path, *, console: Console | None = None) -> CommandOutcome:
    """:func:`build_report` with the exit code and ``--json`` summary the command line needs.

    The report's files (pages, table, plots) are replaced all together when it is done, or not at
    all (:func:`~fusedce_profiler.instrument.staging.all_or_nothing`): Ctrl-C or SIGTERM before
    then leaves the folder as it was, says so in one line, and ends with 130 or 143
    (:attr:`CommandOutcome.stopped`)."""
    from fusedce_profiler.instrument import staging, store

    console = arguments.console(console) or Console(quiet=True)
    run_dir = arguments.path(run_dir, "DIR")
    if run_dir is None:
        raise UsageError("DIR: expected the folder a run wrote, got None")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a folder ({_RUN_KINDS})")
    if not any(store.present(run_dir / name) for name in RESULT_RECORDS):  # before its lock: a stranger's is theirs
        holder = live_holder(run_dir)  # a run that has not stored its first record yet (doctor, explain)
        raise _no_records(run_dir) if holder is None else in_use_for_report(run_dir, holder)
    rebuilt, placed, lines = None, None, _HeldLines()
    try:
        with held_for_report(run_dir), os_errors():  # a write that fails leaves the old report as it was
            try:
                with staging.all_or_nothing() as placed:
                    rebuilt = _rebuilt(run_dir, lines)
            except UsageError:
                raise
            except ValueError as exc:  # a damaged stored file, named by its reader
                raise UsageError(str(exc)) from None
    except KeyboardInterrupt as stopped:
        code = interrupt_exit_code(stopped)
        if placed is not None and placed.done and rebuilt is not None:  # it came as the report was put in place
            lines.say(console)
            console.print(f"stopped by {signal_name(stopped)} once the new report was in place: it is whole "
                          f"({one_line(run_dir)}/summary.md)", markup=False)
            return CommandOutcome(rebuilt[1].records, code, {**rebuilt[1].summary, "exit_code": code}, stopped)
        console.print(f"report interrupted; nothing replaced — run `fusedce-profile report {shell_word(run_dir)}` again",
                      markup=False)
        return CommandOutcome([], code, {"interrupted": signal_name(stopped), "exit_code": code}, stopped)
    if rebuilt is None:
        raise _no_records(run_dir)
    lines.say(console)
    kind, outcome = rebuilt
    if kind in ("model", "parity", "doctor", "recorded"):  # their plots, listed once the new ones are in place
        outcome.summary["plots"] = _plots(run_dir)
    return outcome


def build_report(run_dir: str | Path, *, console: Console | None = None) -> list:
    """Rebuild every table and plot of ``run_dir`` from its stored results; returns the records it
    holds (see the module docstring). ``console``: where the summary lines go (default: nowhere).
    Ctrl-C (or SIGTERM, as :class:`~fusedce_profile.signals.Terminated`) leaves the old report in
    place and is raised again."""
    return report_command(run_dir, console=console).records_or_raise()
