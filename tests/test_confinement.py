"""A run folder from a stranger: nothing outside it is read or written, nothing unbounded is parsed.

Each test plants one hostile thing in a copy of a finished grid folder (a link out of it, an
oversized or deeply nested file, a malformed timeline, a formula-like name) and checks that the
command answers in one line with its documented exit code, and that nothing outside the folder
changed. The folder itself is made once per session by a tiny CPU grid (``finished_run``,
``conftest.py``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument import confined, store
from fusedce_profiler.instrument.environment import ENVIRONMENT_KEYS, collect_environment
from linked import UNTOUCHED, link_out
from processes import cli_env, run_cli
from test_cli_faults import TINY

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults



@pytest.fixture
def run(finished_run, tmp_path):
    """A private copy of the finished folder, beside a file that must never be touched."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy, symlinks=True)
    return copy


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text('{"aws_secret_access_key": "s3cret-value", "date": "leaked"}\n')
    return path


def _report(folder: Path):
    return CliRunner().invoke(app, ["report", str(folder)])


def _one_line_exit_2(result, *needles: str) -> None:
    text = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) <= 2, result.stderr
    for needle in needles:
        assert needle in text, text


def _row(folder: Path) -> dict:
    return json.loads((folder / store.RESULTS_FILE).read_text().splitlines()[0])


def test_resume_never_truncates_a_results_file_linked_outside_the_folder(run):
    (run / store.RESULTS_FILE).unlink()
    outside = link_out(run, store.RESULTS_FILE)
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8,16", "--backend", "torch", "--out", str(run), "--resume"])
    _one_line_exit_2(result, f"{run / store.RESULTS_FILE}: a symbolic link")
    assert outside.read_bytes() == UNTOUCHED


HARD_LINKED = "not a regular file of the folder alone (a hard link, a named pipe, a folder or a device)"


def test_resume_never_writes_into_a_hard_link_to_a_file_outside_the_folder(run):
    """``O_NOFOLLOW`` stops a symbolic link, not a second name of an outside file: the partial-line
    repair cut it and the appends landed in it."""
    (run / store.RESULTS_FILE).unlink()
    outside = link_out(run, store.RESULTS_FILE, hard=True)
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8,16", "--backend", "torch", "--out", str(run), "--resume"])
    _one_line_exit_2(result, f"{run / store.RESULTS_FILE}: {HARD_LINKED}")
    assert outside.read_bytes() == UNTOUCHED


def test_a_hard_linked_lock_note_is_refused_not_truncated(tmp_path):
    folder = tmp_path / "run"
    outside = link_out(folder, store.LOCK_FILE, hard=True)
    with pytest.raises(OSError, match=re.escape(HARD_LINKED)):
        store.RunLock(folder).acquire()
    assert outside.read_bytes() == UNTOUCHED
    store.append_jsonl(folder / "fresh.jsonl", {"a": 1})  # the folder's own files are written as ever
    with pytest.raises(OSError, match=re.escape(HARD_LINKED)):
        store.append_jsonl(folder / store.LOCK_FILE, {"a": 1})
    assert outside.read_bytes() == UNTOUCHED


@pytest.mark.parametrize("hard", [False, True])
def test_appending_a_recording_never_truncates_a_linked_steps_file(tmp_path, hard):
    import torch

    from fusedce_profile import StepRecorder
    from tests.doctor_models import WrappedHeadLM

    folder = tmp_path / "rec"
    outside = link_out(folder, store.RECORDED_STEPS_FILE, hard=hard)
    model = WrappedHeadLM()
    refusal = re.escape(HARD_LINKED) if hard else f"{re.escape(str(folder / store.RECORDED_STEPS_FILE))}: a symbolic link"
    with pytest.warns(RuntimeWarning, match=refusal):  # refused as the recorder takes the folder
        recorder = StepRecorder(model, folder, steps=(0,), append=True, trace=False, report=False)
        with recorder.step():
            model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
        recorder.close()
    assert outside.read_bytes() == UNTOUCHED


def test_report_refuses_a_linked_environment_and_renders_nothing_of_it(run, secret):
    (run / store.ENVIRONMENT_FILE).unlink()
    (run / store.ENVIRONMENT_FILE).symlink_to(secret)
    _one_line_exit_2(_report(run), f"{run / store.ENVIRONMENT_FILE}: a symbolic link")
    for name in ("summary.md", "report.html"):
        assert "s3cret" not in (run / name).read_text()


def test_report_renders_only_the_keys_an_environment_has(run):
    environment = json.loads((run / store.ENVIRONMENT_FILE).read_text())
    environment.update(token="s3cret-value", backends={**environment["backends"], "x": {"deep": "s3cret-value"}})
    (run / store.ENVIRONMENT_FILE).write_text(json.dumps(environment))
    assert _report(run).exit_code == 0
    summary = (run / "summary.md").read_text()
    assert "s3cret" not in summary and "s3cret" not in (run / "report.html").read_text()
    assert f"torch: {environment['torch']}" in summary


def test_report_refuses_a_folder_that_is_a_link_and_takes_one_reached_through_a_link(run, tmp_path):
    """``report`` rewrites the folder's pages, so the folder named may not be a link (as ``--out``);
    a link among the folders above it is the user's path to it, and is followed."""
    linked = tmp_path / "linked-run"
    linked.symlink_to(run)
    result = _report(linked)
    assert result.exit_code == 2 and "a symbolic link" in result.output, result.output
    above = tmp_path / "above"
    above.symlink_to(run.parent)
    assert _report(above / run.name).exit_code == 0


@pytest.mark.parametrize("name", [store.PLAN_FILE, "snapshots/torch.timeline.json"])
def test_report_refuses_other_linked_files(run, secret, name):
    if name.endswith(store.TIMELINE_SUFFIX):
        row = _row(run)
        row["timeline_path"] = name
        (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    (run / name).parent.mkdir(exist_ok=True)
    if (run / name).exists():
        (run / name).unlink()
    (run / name).symlink_to(secret)
    _one_line_exit_2(_report(run), f"{run / name}: a symbolic link")


def _make_not_regular(path: Path, kind: str) -> None:
    """Put at ``path`` what no reader may take for a file: a link to ``/dev/null``, a dangling link, a folder, a
    named pipe or a socket (which gave the system's bare "No such device or address")."""
    if kind == "link to /dev/null":
        path.symlink_to("/dev/null")
    elif kind == "dangling link":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":  # bound by its name from its folder: a socket's path is limited to 107 bytes
        import socket

        here = os.getcwd()
        os.chdir(path.parent)
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(path.name)
        finally:
            os.chdir(here)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["link to /dev/null", "dangling link", "folder", "named pipe", "socket"])
def test_a_plan_that_is_not_a_regular_file_is_refused_never_read_as_no_plan(run, kind):
    """Read as "no plan", a cut run's report said it was complete (no "interrupted" note), exit 0."""
    plan = run / store.PLAN_FILE
    if plan.exists():
        plan.unlink()
    _make_not_regular(plan, kind)
    fragment = "a symbolic link" if "link" in kind else "not a regular file"
    _one_line_exit_2(_report(run), f"{plan}: {fragment}")


def test_a_linked_logs_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / store.PLAN_FILE).write_text('{"cells": []}\n')  # a run's folder, interrupted before its first cell
    (out / store.LOGS_DIR).symlink_to(elsewhere)
    result = CliRunner().invoke(app, [*TINY, "--tokens", "8", "--backend", "torch", "--out", str(out), "--resume"])
    _one_line_exit_2(result, f"{out / store.LOGS_DIR}: a symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_an_oversized_timeline_is_refused_before_it_is_parsed(run):
    row = _row(run)
    row["timeline_path"] = "snapshots/big.timeline.json"
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    (run / "snapshots").mkdir(exist_ok=True)
    with (run / "snapshots" / "big.timeline.json").open("wb") as fh:
        fh.truncate(confined.SIZE_LIMITS[store.TIMELINE_SUFFIX] + 1)  # sparse: no disk used
    _one_line_exit_2(_report(run), "big.timeline.json", "over the limit of 67108864 bytes")


@pytest.mark.parametrize("name", [store.RESULTS_FILE, store.ENVIRONMENT_FILE, store.PLAN_FILE])
def test_deeply_nested_json_is_one_line_naming_the_file(run, name):
    (run / name).write_text("[" * 50_000 + "]" * 50_000 + "\n")
    _one_line_exit_2(_report(run), f"{run / name}", f"nested deeper than the limit of {confined.MAX_NESTING}")


@pytest.mark.parametrize("timeline", [[1, 2], {"times_ms": [0.0], "allocated_bytes": [1], "live_at_peak": [3]},
                                      {"times_ms": [0.0], "allocated_bytes": [1], "live_at_peak": "x"}])
def test_a_malformed_timeline_is_a_note_not_a_traceback(run, timeline):
    row = _row(run)
    row["timeline_path"] = "snapshots/bad.timeline.json"
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    (run / "snapshots").mkdir(exist_ok=True)
    (run / "snapshots" / "bad.timeline.json").write_text(json.dumps(timeline))
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert "bad.timeline.json: not a timeline" in " ".join(result.stdout.split())


def test_a_timeline_with_a_long_legal_name_is_drawn_under_a_name_the_file_system_takes(run):
    """A 241-character stem (a legal file name) made the plot's name, with its prefix and a temporary's
    suffix, too long for the file system: the whole report failed, exit 2."""
    from fusedce_reports.timeline import timeline_plot_name

    stem = "é" + "L" * 238  # with ".timeline.json": 254 bytes, a legal name
    row = _row(run)
    row["timeline_path"] = f"snapshots/{stem}.timeline.json"
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    (run / "snapshots").mkdir(exist_ok=True)
    (run / "snapshots" / f"{stem}.timeline.json").write_text(json.dumps(
        {"times_ms": [0.0, 1.0], "allocated_bytes": [1, 2], "peak_bytes": 2, "peak_ms": 1.0}))
    result = _report(run)
    assert result.exit_code == 0, result.output
    name = timeline_plot_name(stem)
    assert (run / "plots" / name).is_file() and len(name.encode()) <= 200 and name.startswith("timeline_éLLL")
    assert timeline_plot_name("short") == "timeline_short.png" and name != timeline_plot_name(stem[:-1])


def test_rows_of_an_older_and_a_newer_version_report_side_by_side(run):
    row = _row(run)
    older = {k: v for k, v in row.items() if k not in ("timeline_path", "log_path", "extra", "memory_source")}
    newer = {**row, "spec": {**row["spec"], "tokens": 16}, "a_field_of_a_later_version": [1, 2]}
    (run / store.RESULTS_FILE).write_text(json.dumps(older) + "\n" + json.dumps(newer) + "\n")
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert "a_field_of_a_later_version" not in (run / "summary.md").read_text()


@pytest.mark.parametrize("name", ["=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)", "torch\n=1"])
def test_a_formula_like_backend_name_is_never_read_back(run, name):
    row = _row(run)
    bad = {**row, "spec": {**row["spec"], "backend": name, "tokens": 16}}
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n" + json.dumps(bad) + "\n")
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert "spec.backend must be a back-end name or 'module:callable'" in " ".join(result.stdout.split())
    assert len((run / "results.csv").read_text().splitlines()) == 2  # the header and the valid row


def test_a_formula_like_message_is_neutralised_in_the_csv(run):
    row = {**_row(run), "message": "=cmd|' /C calc'!A0"}
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    assert _report(run).exit_code == 0
    assert "'=cmd|" in (run / "results.csv").read_text()


def test_report_refuses_a_folder_a_live_run_holds(run):
    with store.RunLock(run):
        result = run_cli(["report", str(run)], cli_env())
    assert result.returncode == 2 and "is in use by pid" in result.stderr and "Traceback" not in result.stderr
    assert "a run is still writing into it" in " ".join(result.stderr.split())


def test_a_finished_folder_holds_no_lock_host_home_path_or_command_line(finished_run):
    assert not (finished_run / store.LOCK_FILE).exists()
    environment = json.loads((finished_run / store.ENVIRONMENT_FILE).read_text())
    leaks = {"host name": rf"\b{re.escape(socket.gethostname())}\b", "home": re.escape(str(Path.home()) + "/"),
             "run folder": re.escape(str(finished_run.parent)), "interpreter": re.escape(str(Path(sys.executable).parent)),
             "command line": "--backend"}
    for path in finished_run.rglob("*"):
        if not path.is_file() or path.suffix == ".png" or path.name == store.ENVIRONMENT_FILE:
            continue
        text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", path.read_text(errors="replace"))
        for what, pattern in leaks.items():
            assert not re.search(pattern, text), f"{path.relative_to(finished_run)} holds the {what}"
    assert set(environment) <= {"resumed", *ENVIRONMENT_KEYS}


def test_the_known_environment_keys_are_those_collected():
    assert tuple(collect_environment()) == ENVIRONMENT_KEYS


def test_a_stored_environment_keeps_only_values_of_the_type_collected():
    """``"gpu_count": "x"`` was rendered into the report's environment block as written."""
    from fusedce_profiler.instrument.environment import known_environment

    collected = collect_environment()
    assert known_environment(collected) == collected  # what the tool writes, it keeps
    stored = {**collected, "gpu_count": "x", "cpu_count": [1], "gpu_memory_bytes": True, "cudnn": -1,
              "torch": {"a": 1}, "python": 3.11, "date": None}
    kept = known_environment(stored)
    assert not {"gpu_count", "cpu_count", "gpu_memory_bytes", "cudnn", "torch", "python"} & set(kept)
    assert kept["date"] is None and kept["platform"] == collected["platform"]


def test_a_stored_environment_keeps_only_the_back_ends_and_libraries_the_tool_records():
    """A name added under ``backends`` or ``libraries`` was rendered into the report as a version."""
    from fusedce_profiler.instrument.environment import known_environment

    collected = collect_environment()
    stored = {**collected, "backends": {**collected["backends"], "INJECTED": "1.0", "torch": 2},
              "libraries": {**collected["libraries"], "x": "y"}}
    kept = known_environment(stored)
    assert kept["backends"] == {k: v for k, v in collected["backends"].items() if k != "torch"}
    assert kept["libraries"] == collected["libraries"]


def test_files_of_a_finished_folder_follow_the_umask(finished_run):
    modes = {path.name: path.stat().st_mode & 0o777 for path in finished_run.rglob("*") if path.is_file()}
    assert set(modes.values()) <= {0o644, 0o664}, modes


MODEL_FOLDER = Path(__file__).parent / "fixtures" / "h200_model"


@pytest.mark.parametrize("field, value, message", [
    ("time_ms", "fast", "time_ms must be a number"),
    ("memory.peak", "1 GiB", "memory.peak must be an integer"),
    ("job.batch", 3.5, "job.batch must be an integer"),
    ("job.backend", "=1+1", "job.backend must be a back-end name"),
    ("status", "pwned", "status must be one of"),
])
def test_a_model_row_whose_fields_are_not_their_types_is_skipped_naming_the_field(tmp_path, field, value, message):
    run = tmp_path / "model"
    shutil.copytree(MODEL_FOLDER, run)
    lines = (run / store.MODEL_RESULTS_FILE).read_text().splitlines()
    row = json.loads(lines[0])
    owner, _, name = field.rpartition(".")
    (row[owner] if owner else row)[name] = value
    (run / store.MODEL_RESULTS_FILE).write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert f"{store.MODEL_RESULTS_FILE}:1" in result.stdout and message in " ".join(result.stdout.split())


def _rows_of_token_counts(folder: Path, counts: range) -> None:
    row = _row(folder)
    lines = []
    for tokens in counts:
        row["spec"]["tokens"] = tokens
        lines.append(json.dumps(row))
    (folder / store.RESULTS_FILE).write_text("\n".join(lines) + "\n")


def test_a_results_file_of_too_many_lines_is_refused_in_one_line(run, monkeypatch):
    """200,000 rows fit the size limit; their report ran past five minutes at 5.8 GB."""
    monkeypatch.setattr(confined, "MAX_LINES", 5)
    _rows_of_token_counts(run, range(8, 14))
    parsed = []
    real = confined.loads
    monkeypatch.setattr(confined, "loads", lambda *args: parsed.append(1) or real(*args))
    _one_line_exit_2(_report(run), f"{run / store.RESULTS_FILE}: more than 5 lines")
    assert not parsed  # refused before a line was parsed


def test_lines_are_counted_with_an_unterminated_last_one(tmp_path):
    import io

    for text, lines in ((b"", 0), (b"a\n", 1), (b"a\nb", 2), (b"a\n\nb\n", 3), (b"x" * (3 << 20) + b"\ny", 2)):
        fh = io.BytesIO(text)
        assert confined._count_lines(fh, len(text)) == lines and fh.tell() == 0
    fh = io.BytesIO(b"a\nb\nc\n")
    assert confined._count_lines(fh, 4) == 2  # only the bytes the file held when it was opened


def test_a_grid_of_more_token_counts_than_a_plot_shows_is_reported_without_plots(run, monkeypatch):
    """2,000 token counts drew a tick and a frontier point each: 90 s of plotting for one report."""
    from fusedce_reports import build

    monkeypatch.setattr(build, "MAX_PLOTTED_TOKEN_COUNTS", 3)
    shutil.rmtree(run / "plots")
    _rows_of_token_counts(run, range(8, 12))
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert "plots not drawn: 4 token counts, more than the 3 a plot can show apart" in " ".join(result.stdout.split())
    assert not list((run / "plots").glob("*.png"))
    assert (run / "summary.md").read_text().count("| torch |") == 4


@pytest.mark.parametrize("name", [store.RESULTS_FILE, store.DOCTOR_FILE])
def test_a_pipe_in_place_of_a_record_is_named_not_waited_on(run, name):
    """A named pipe where the record is: one line naming it (it was taken for a missing file, and
    the folder for no run's at all), never a reader waiting on the pipe."""
    import os

    (run / store.RESULTS_FILE).unlink()
    os.mkfifo(run / name)
    _one_line_exit_2(_report(run), f"{run / name}: not a regular file")


@pytest.mark.parametrize("name", ["interrupted.json", store.FIT_FILE])
@pytest.mark.parametrize("kind", ["link to /dev/null", "dangling link", "folder", "named pipe"])
def test_a_mark_or_fit_file_that_is_not_a_regular_file_is_refused_never_read_as_absent(tmp_path, name, kind):
    """Read as absent, a cut run's report no longer said it was interrupted."""
    from fusedce_profiler.instrument.interruption import read_interruption
    from fusedce_profiler.judgements.fit import load_fits

    path = tmp_path / name
    _make_not_regular(path, kind)
    with pytest.raises(confined.FolderRefused, match=str(path)):
        read_interruption(tmp_path) if name == "interrupted.json" else load_fits(tmp_path)


@pytest.mark.parametrize("text", ["{", '{"signal": 5, "finished": [1, 2], "continue_with": {"a": null}}',
                                  '{"signal": "SIGTERM", "finished": "1 of 2 jobs"}'])
def test_a_damaged_or_mistyped_interruption_mark_is_named_never_ignored_or_shown(tmp_path, text):
    """A mark of numbers, lists and objects was shown as "Interrupted by 5 after [1, 2] …", exit 0."""
    from fusedce_profiler.instrument.interruption import read_interruption

    (tmp_path / "interrupted.json").write_text(text)
    with pytest.raises(ValueError, match="interrupted.json"):
        read_interruption(tmp_path)


@pytest.mark.parametrize("kind", ["link to /dev/null", "dangling link", "named pipe", "folder"])
def test_a_new_run_clears_any_file_holding_the_marks_name_or_refuses_a_folder_before_it_runs(tmp_path, kind):
    """``model --force`` left a pipe in its place, measured every job, then refused to write its report."""
    from fusedce_profiler.instrument.interruption import clear_interruption

    path = tmp_path / "interrupted.json"
    _make_not_regular(path, kind)
    if kind == "folder":
        with pytest.raises(ValueError, match=f"^{path}: a folder where a run keeps its interruption mark"):
            clear_interruption(tmp_path)
        assert path.is_dir()
    else:
        clear_interruption(tmp_path)
        assert not os.path.lexists(path) and os.path.exists("/dev/null")


def test_report_of_a_folder_no_run_wrote_leaves_its_lock_file_alone(tmp_path):
    """Another program's ``.lock`` in a folder holding no record: refused before the report's own lock
    is taken, so that file is neither truncated nor removed."""
    folder = tmp_path / "X"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / ".lock").write_text("another program's lock\n")
    result = CliRunner().invoke(app, ["report", str(folder)])
    assert result.exit_code == 2 and "no results.jsonl" in result.output
    assert (folder / ".lock").read_text() == "another program's lock\n"
