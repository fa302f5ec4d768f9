"""What a folder's contents can make ``report`` cost or show: bounded, whatever the files hold.

Each test plants one thing in a copy of a finished grid folder — a timeline of more points than a
plot can show, one listing a crowd of live blocks, a message of megabytes, characters that reorder
or hide text — or stops ``report`` with a signal, and checks what the report writes and prints.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profiler.instrument import snapshot, store
from fusedce_profiler.instrument.text import MAX_SHOWN_CHARS, printable
from fusedce_reports.timeline import draw_timeline, read_timeline
from processes import cli_env, kill_group, start_cli, wait_for

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

REPORT_FILES = ("summary.md", "report.html", "results.csv")


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy, symlinks=True)
    return copy


def _plain(text: str) -> str:
    return " ".join(text.split())


def _first_row(folder: Path) -> dict:
    return json.loads((folder / store.RESULTS_FILE).read_text().splitlines()[0])


def _plant_timeline(folder: Path, timeline: dict) -> Path:
    """``timeline`` stored as the first row's timeline; returns its path."""
    row = _first_row(folder)
    row["timeline_path"] = "snapshots/planted.timeline.json"
    (folder / store.RESULTS_FILE).write_text(json.dumps(row) + "\n")
    (folder / store.SNAPSHOTS_DIR).mkdir(exist_ok=True)
    path = folder / store.SNAPSHOTS_DIR / "planted.timeline.json"
    path.write_text(json.dumps(timeline))
    return path


def _report(folder: Path):
    return CliRunner().invoke(app, ["report", str(folder)])


def test_a_timeline_of_more_points_than_a_plot_shows_is_thinned_on_read_keeping_its_peak(run):
    """15 million points fit a timeline's size limit; drawn whole they took the report to 5.8 GB."""
    points = 20 * snapshot.MAX_TIMELINE_POINTS
    rng = random.Random(0)
    allocated = [rng.randrange(1 << 20) for _ in range(points)]
    peak = points // 3
    allocated[peak] = 1 << 30
    times = [i * 0.001 for i in range(points)]
    path = _plant_timeline(run, {"times_ms": times, "allocated_bytes": allocated, "peak_bytes": 1 << 30,
                                 "peak_ms": times[peak], "live_at_peak": []})

    timeline = read_timeline(path, run)
    assert len(timeline.times_ms) <= snapshot.MAX_TIMELINE_POINTS and timeline.thinned_from == points
    kept = dict(zip(timeline.times_ms, timeline.allocated_bytes))
    around = range(peak - snapshot.PEAK_NEIGHBOURS, peak + snapshot.PEAK_NEIGHBOURS + 1)
    assert all(kept[times[i]] == allocated[i] for i in around)  # the peak and its neighbours, exactly
    assert min(timeline.allocated_bytes) == min(allocated)  # the lows are drawn too
    assert all(kept[t] == allocated[round(t * 1000)] for t in kept)  # every point is one of the file's

    result = _report(run)
    assert result.exit_code == 0, result.output
    said = f"drawn from {points:,} points as {len(timeline.times_ms):,}"
    assert said in (run / "summary.md").read_text() and said in (run / "report.html").read_text()


def test_a_timeline_listing_a_crowd_of_live_blocks_lists_the_largest_and_counts_the_others(run):
    """A million blocks alive at the peak, each a line of the plot's side panel: over 300 s."""
    blocks = 50_000
    rng = random.Random(1)
    sizes = [rng.randrange(1, 1 << 30) for _ in range(blocks)]
    live = [{"size": size, "frame": f"train.py:{i}:step", "stack": ["x"] * 20} for i, size in enumerate(sizes)]
    path = _plant_timeline(run, {"times_ms": [0.0, 1.0], "allocated_bytes": [0, sum(sizes)],
                                 "peak_bytes": sum(sizes), "peak_ms": 1.0, "live_at_peak": live})

    timeline = read_timeline(path, run)
    largest = sorted(sizes, reverse=True)[:snapshot.LISTED_BLOCKS]
    assert [block.size for block in timeline.live_at_peak] == largest
    assert all(len(block.stack) == snapshot.STACK_DEPTH for block in timeline.live_at_peak)
    others = blocks - snapshot.LISTED_BLOCKS
    assert (timeline.unlisted_blocks, timeline.unlisted_bytes) == (others, sum(sizes) - sum(largest))
    [panel] = draw_timeline(timeline).findobj(lambda artist: artist.get_gid() == "live-at-peak")
    panel = panel.get_text().splitlines()
    assert len(panel) == 1 + snapshot.LISTED_BLOCKS + 1 and panel[-1].endswith(f"in {others:,} smaller blocks")

    assert _report(run).exit_code == 0


def test_a_message_of_megabytes_is_cut_in_every_page_and_on_the_terminal(run):
    """A results.jsonl of 248 MB of messages gave a report.html of 230 MB: each copied whole."""
    row = _first_row(run)
    huge = "x" * 3_000_000  # one word: the terminal's shortening keeps a word whole
    failed = {**row, "spec": {**row["spec"], "tokens": 16}, "status": "error", "message": huge}
    ill_typed = {**row, "spec": {**row["spec"], "tokens": huge}}
    lines = [json.dumps(row), json.dumps(failed), json.dumps(ill_typed)]
    (run / store.RESULTS_FILE).write_text("\n".join(lines) + "\n")

    result = _report(run)
    assert result.exit_code == 0, result.output
    for where, text in {"summary.md": (run / "summary.md").read_text(), "report.html": (run / "report.html").read_text(),
                        "terminal": result.output}.items():
        assert len(text) < 300_000, where
        assert "x" * (MAX_SHOWN_CHARS + 1) not in " ".join(text.split()), where  # the terminal wraps lines
        assert "more characters in the stored record)" in text, where
    assert (run / store.RESULTS_FILE).read_text().count(huge) == 2  # the record keeps it whole


UNSEEN = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\u200c\u200d\u200e\u200f\ufeff\u061c\u2028"


def _shown_with_failed_message(run, message: str) -> dict[str, str]:
    """Every page and the terminal of ``report`` on ``run`` with a second, failed row saying ``message``."""
    row = _first_row(run)
    failed = {**row, "spec": {**row["spec"], "tokens": 16}, "status": "error", "message": message}
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n" + json.dumps(failed) + "\n")
    result = _report(run)
    assert result.exit_code == 0, result.output
    return {name: (run / name).read_text() for name in REPORT_FILES} | {"terminal": result.output}


def test_bidirectional_and_invisible_characters_are_spelled_out_in_every_report(run):
    """A message that reads differently from what it holds (Trojan-source style) reaches no page
    and no terminal as it is."""
    shown = _shown_with_failed_message(run, "access granted\u202e\u2066 if admin\u2069\u2066 \u200bsure\ufeff")
    for where, text in shown.items():
        assert not set(text) & set(UNSEEN), where
        assert "\\u202e\\u2066 if admin\\u2069" in text, where
    assert printable(UNSEEN) == "".join(f"\\u{ord(c):04x}" for c in UNSEEN)


HIDING = "\u00ad\u115f\u3164\ufe0f\U000e0001\U000e0049\U000e007f\U0001d173"


def test_characters_that_hide_text_are_spelled_out_in_every_report(run):
    """Default-ignorable characters a viewer draws as nothing — the soft hyphen, the Hangul fillers, a
    variation selector, and the tag characters that spell invisible text (here a hidden "I") —
    reach no page and no terminal as they are."""
    shown = _shown_with_failed_message(run, "ok\U000e0049\u00ad\u115f\ufe0f done")
    for where, text in shown.items():
        assert not set(text) & set(HIDING), where
        assert "ok\\U000e0049\\xad\\u115f\\ufe0f done" in text, where
    assert printable(HIDING) == "\\xad\\u115f\\u3164\\ufe0f\\U000e0001\\U000e0049\\U000e007f\\U0001d173"


def _report_files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file a report writes: (inode, content) by name."""
    paths = [folder / name for name in REPORT_FILES] + sorted((folder / store.PLOTS_DIR).iterdir())
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.read_bytes()) for p in paths}


def _rebuild_started(folder: Path, before: dict[str, tuple[int, bytes]]):
    """True once the report has written its first plot (under a temporary name or in place)."""
    def started() -> bool:
        plots = folder / store.PLOTS_DIR
        return any(p.name.endswith(".tmp") for p in plots.iterdir()) or \
            (plots / "peak_memory.png").stat().st_ino != before["plots/peak_memory.png"][0]
    return started


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_report_replaces_nothing_and_says_so_in_one_line(run, signum, code):
    """Ctrl-C during a slow report left new plots beside the old summary.md, with exit 130 and
    no word."""
    _plant_timeline(run, {"times_ms": [0] * 4_000_000, "allocated_bytes": [1] * 4_000_000})  # a second to read
    before = _report_files(run)
    process = start_cli(["report", str(run)], cli_env())
    try:
        wait_for(_rebuild_started(run, before), 60, "the report to draw its first plot", process)
        os.killpg(process.pid, signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        kill_group(process)
    assert process.returncode == code, stderr
    assert f"report interrupted; nothing replaced — run `fusedce-profile report {run}` again" in _plain(stdout)
    assert "Traceback" not in stderr
    assert _report_files(run) == before
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_as_the_report_is_put_in_place_is_taken_after_it(run, monkeypatch, signum, code):
    """The renames that put a finished report in place are not cut by Ctrl-C or a closed terminal:
    the signal is taken after them."""
    from fusedce_profiler.instrument import staging

    replace = os.replace

    def interrupted_replace(source, target):
        replace(source, target)
        if str(target).endswith("summary.md"):
            os.kill(os.getpid(), signum)
            time.sleep(0.1)  # a handler that raised would have raised by now

    monkeypatch.setattr(staging.os, "replace", interrupted_replace)
    (run / "summary.md").write_text("old")
    result = _report(run)
    assert result.exit_code == code, result.output
    assert "nothing replaced" not in result.output
    assert f"once the new report was in place: it is whole ({run}/summary.md)" in _plain(result.output)
    assert (run / "summary.md").read_text() != "old" and "torch" in (run / "report.html").read_text()


def test_a_page_that_is_a_folder_is_named_in_one_line_and_nothing_is_replaced(run):
    (run / "report.html").write_text("old")
    shutil.rmtree(run / "summary.md", ignore_errors=True)
    (run / "summary.md").unlink(missing_ok=True)
    (run / "summary.md").mkdir()
    result = _report(run)
    assert result.exit_code == 2, result.output
    assert _plain(result.output).endswith(f"error: {run}/summary.md: Is a directory")
    assert (run / "report.html").read_text() == "old" and not list(run.glob(".*.tmp"))
    # the only line: no "Report: …" claiming the new files came before the error said they were not written
    assert len(result.output.strip().splitlines()) == 1 and "Report:" not in result.output, result.output


def test_the_temporaries_a_report_killed_outright_left_are_removed_by_the_next(run):
    """``kill -9`` while a report writes leaves its temporaries (``plots/.peak_memory.png.XXXXXXXX.tmp``):
    the next report removes those of the files it replaces, and nothing of another name."""
    plots = run / "plots"
    plots.mkdir(exist_ok=True)
    stale = [run / ".summary.md.k9x2_a7q.tmp", plots / ".peak_memory.png.0abc_12z.tmp"]
    others = [run / ".notes.txt.0abc_12z.tmp", run / ".summary.md.tmp", plots / "mine.tmp"]
    for path in stale + others:
        path.write_bytes(b"partial")
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert (plots / "peak_memory.png").exists()
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in others)


@pytest.mark.parametrize("planted", ["page folder", "linked timeline"])
def test_a_refusal_names_the_file_by_the_path_given(run, monkeypatch, planted):
    """``report run`` from the folder above names ``run/…``, as it names every other file: a
    refusal gives no absolute path of the machine it ran on."""
    if planted == "page folder":
        (run / "summary.md").unlink(missing_ok=True)
        (run / "summary.md").mkdir()
        named = "run/summary.md"
    else:
        timeline = _plant_timeline(run, {})
        timeline.unlink()
        timeline.symlink_to(run / store.RESULTS_FILE)
        named = "run/snapshots/planted.timeline.json"
    monkeypatch.chdir(run.parent)
    result = CliRunner().invoke(app, ["report", "run"])
    assert result.exit_code == 2, result.output
    assert named in result.output and str(run.parent) not in result.output, result.output


@pytest.mark.parametrize("planted", ["folder", "too many lines"])
def test_report_refusing_a_results_file_names_it_and_offers_no_report_of_itself(run, monkeypatch, planted):
    """A folder in place of ``results.jsonl`` was named by a file descriptor ("5: Is a directory");
    a refused file got the advice to run ``report`` again, the command that just failed."""
    from fusedce_profiler.instrument import confined

    results = run / store.RESULTS_FILE
    if planted == "folder":
        results.unlink()
        results.mkdir()
        why = "run/results.jsonl: not a regular file"
    else:
        monkeypatch.setattr(confined, "MAX_LINES", 1)
        results.write_text(results.read_text().splitlines()[0] + "\n" * 3)
        why = "run/results.jsonl: more than 1 lines, over the limit"
    monkeypatch.chdir(run.parent)
    result = CliRunner().invoke(app, ["report", "run"])
    assert result.exit_code == 2, result.output
    assert why in _plain(result.output) and "writes the report" not in result.output, result.output


def test_an_integer_past_a_floats_range_is_a_note_not_a_traceback(run):
    """JSON reads ``1`` followed by 400 zeros as an integer no float holds: a row or a timeline
    holding one in a number field is named, never a traceback."""
    row = _first_row(run)
    row["timeline_path"] = "snapshots/planted.timeline.json"
    huge = "1" + "0" * 400
    (run / store.RESULTS_FILE).write_text(json.dumps(row) + "\n" + json.dumps(row).replace(
        '"time_ms": ', f'"time_ms": {huge}, "was": ', 1) + "\n")
    (run / store.SNAPSHOTS_DIR).mkdir(exist_ok=True)
    (run / store.SNAPSHOTS_DIR / "planted.timeline.json").write_text(
        f'{{"times_ms": [{huge}], "allocated_bytes": [1]}}')
    result = _report(run)
    assert result.exit_code == 0, result.output
    said = _plain(result.stdout)
    assert "results.jsonl:2: not a valid row (an integer of 401 digits, more than the 40 any stored value has)" in said
    assert "planted.timeline.json: not a timeline (an integer of 401 digits, more than the 40 any stored value has)" \
        in said


def test_a_recorded_steps_folder_shows_its_stored_strings_cut_and_spelled_out(tmp_path):
    """The report of steps recorded in the user's own run writes their notes and labels too."""
    import dataclasses

    from fusedce_profiler.instrument.recording.records import EvalPass, append_recorded_step
    from test_recorded_report import _record

    record = dataclasses.replace(_record([EvalPass("validation", 0)], device="cpu"), label="run\u202e1",
                                 notes=["y" * 1_000_000])
    append_recorded_step(tmp_path, record)
    result = _report(tmp_path)
    assert result.exit_code == 0, result.output
    page = (tmp_path / "summary.md").read_text()
    assert len(page) < 100_000 and "y" * (MAX_SHOWN_CHARS + 1) not in page
    assert "more characters in the stored record)" in page
    assert "\u202e" not in page and "run\\u202e1" in page


def test_a_second_signal_while_a_stopped_run_writes_its_report_replaces_nothing(run, monkeypatch):
    """A second SIGTERM while an interrupted grid wrote its report left half its plots and no
    summary.md, with Ctrl-C's exit code and no word."""
    from rich.console import Console

    from fusedce_profile import grid_run
    from fusedce_profile.signals import Terminated
    from fusedce_reports import build_report

    before = _report_files(run)

    def cut_short(folder):
        build_report(folder)  # every file written, under temporary names, then the second signal
        raise Terminated()

    monkeypatch.setattr(grid_run, "build_report", cut_short)
    console = Console(record=True, width=400)
    outcome = grid_run.finish(run, console, stopped=Terminated())
    assert outcome.exit_code == 143 and outcome.summary["interrupted"] == "SIGTERM"
    assert f"report interrupted; its files were not replaced (the finished cells are kept): run " \
           f"`fusedce-profile report {run}` to write it" in console.export_text()
    assert _report_files(run) == before and len(outcome.records) == len(_rows_of(run))
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


def test_two_signals_end_the_command_with_the_first_ones_code(run, monkeypatch):
    """SIGTERM stopped the run; Ctrl-C then cut the report it was writing, or landed while the
    SIGTERM still unwound: either way the command says SIGTERM and exits 143."""
    from rich.console import Console

    from fusedce_profile import grid_run
    from fusedce_profile.signals import Terminated, interrupt_exit_code, signal_name

    def cut_by_ctrl_c(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(grid_run, "build_report", cut_by_ctrl_c)
    outcome = grid_run.finish(run, Console(quiet=True), stopped=Terminated())
    assert outcome.exit_code == 143 and outcome.summary["interrupted"] == "SIGTERM"
    try:
        try:
            raise Terminated()
        except Terminated:  # a worker being shut down as the SIGTERM unwinds
            raise KeyboardInterrupt  # Ctrl-C, Python keeps the SIGTERM as its context
    except KeyboardInterrupt as second:
        assert (interrupt_exit_code(second), signal_name(second)) == (143, "SIGTERM")


def test_a_first_report_cut_short_leaves_no_empty_plots_folder(run, monkeypatch):
    """A folder whose report was never written (a run stopped before it) gets no empty
    ``plots/`` from a report that a signal cuts short."""
    import shutil

    from rich.console import Console

    from fusedce_profile import grid_run
    from fusedce_profile.signals import Terminated
    from fusedce_reports import build_report

    shutil.rmtree(run / store.PLOTS_DIR)
    for name in ("summary.md", "report.html", "results.csv"):
        (run / name).unlink()

    def cut_short(folder):
        build_report(folder)
        raise Terminated()

    monkeypatch.setattr(grid_run, "build_report", cut_short)
    outcome = grid_run.finish(run, Console(quiet=True), stopped=Terminated())
    assert outcome.exit_code == 143
    assert not (run / store.PLOTS_DIR).exists()
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]


def _rows_of(folder: Path) -> list[str]:
    return (folder / store.RESULTS_FILE).read_text().splitlines()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_whose_exception_python_drops_in_a_callback_still_replaces_nothing(tmp_path, signum):
    """A stop signal's handler raises; when the signal lands while Python runs a weak reference's
    callback, that exception is printed and dropped, and the block went on to its end. It must
    still end as stopped: nothing put in place, the signal's exception raised after the block."""
    import weakref

    from fusedce_profile.signals import Terminated, stop_on_sigterm
    from fusedce_profiler.instrument import staging

    class Carrier:
        pass

    target = tmp_path / "summary.md"
    target.write_text("old")
    expected = KeyboardInterrupt if signum == signal.SIGINT else Terminated
    with stop_on_sigterm(), pytest.raises(expected):
        with staging.all_or_nothing():
            store.write_text(target, "new")
            carrier = Carrier()
            hook = weakref.ref(carrier, lambda ref: signal.raise_signal(signum))  # raised inside the callback
            del carrier  # the callback runs here; its exception is dropped ("Exception ignored in …")
            assert hook() is None
    assert target.read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_stop_dropped_inside_a_callback_is_not_printed_as_an_ignored_exception(monkeypatch):
    """Python prints "Exception ignored in …" with a traceback for a signal's exception raised inside a
    weak reference's callback; the staging block notes that stop and reports it itself."""
    import sys
    from types import SimpleNamespace

    from fusedce_profiler.instrument import staging

    printed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(type(unraisable.exc_value)))
    hook = sys.unraisablehook

    def unraisable(exc):
        return SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None, err_msg="Exception ignored in",
                               object=None)

    with staging._signals_noted() as received:
        sys.unraisablehook(unraisable(ValueError("a real bug")))  # not a stop: shown as Python shows it
        received.append(signal.SIGINT)
        sys.unraisablehook(unraisable(KeyboardInterrupt()))
        sys.unraisablehook(unraisable(ValueError("another")))
    assert printed == [ValueError, ValueError]
    assert sys.unraisablehook is hook


@pytest.mark.parametrize("example, write", [
    ("model/model-eval", "fusedce_reports.model_report:write_model_report"),
    ("model/parity", "fusedce_reports.parity_report:write_parity_report"),
    ("recorded/lightning-bf16-mixed-h200", "fusedce_reports.recorded_report:write_recorded_report"),
])
def test_a_page_that_cannot_be_written_leaves_no_new_plot_beside_the_old_page(tmp_path, example, write):
    """A run's own report is one set, as ``report``'s is: when its page cannot be written (a full
    disk; here the page's name is a folder) no plot of the new set takes its place either."""
    import importlib

    folder = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / example, folder)
    shutil.rmtree(folder / store.PLOTS_DIR)
    (folder / "summary.md").unlink()
    (folder / "summary.md").mkdir()
    module, function = write.split(":")
    with pytest.raises(IsADirectoryError):
        getattr(importlib.import_module(module), function)(folder)
    assert not (folder / store.PLOTS_DIR).exists()
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_a_results_file_growing_while_it_is_read_is_read_as_it_was_when_opened(tmp_path):
    """Its size was checked once, at the open: another process appending rows meanwhile took ``report``
    to 3.2 GiB for a file whose size at the open was within its limit (1 GiB untouched)."""
    from fusedce_profiler.instrument import confined

    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3')
    lines = confined.jsonl_lines(path)
    first = next(lines)
    with open(path, "ab") as grow:
        grow.write(b'}\n' + b'{"a": 4}\n' * 1000)
    assert [first, *lines] == [(1, b'{"a": 1}', False), (2, b'{"a": 2}', False), (3, b'{"a": 3', True)]
