"""The run-folder store: the lock, writes that fail name their file, nothing through a link, bounded reads."""
import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from pathlib import Path

from linked import UNTOUCHED, link_out
from processes import REPO
from fusedce_profiler.instrument import confined, store

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults


def test_the_lock_is_reentrant_in_one_process_and_exclusive_across_processes(tmp_path):
    outer = store.RunLock(tmp_path).acquire()
    inner = store.RunLock(tmp_path).acquire()  # e.g. the command, then the run it starts
    other = [sys.executable, "-c", f"from fusedce_profiler.instrument import store; store.RunLock({str(tmp_path)!r}).acquire()"]
    held = subprocess.run(other, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert held.returncode != 0 and f"is in use by pid {os.getpid()}" in held.stderr
    inner.release()
    assert subprocess.run(other, cwd=REPO, capture_output=True, text=True, timeout=60).returncode != 0
    outer.release()  # the last release frees it
    assert subprocess.run(other, cwd=REPO, capture_output=True, text=True, timeout=60).returncode == 0


def _refusals_in_threads(folder, count: int) -> list[Exception]:
    """Take ``folder``'s lock in ``count`` threads, one after the other: the refusals."""
    import threading

    refused: list[Exception] = []

    def take() -> None:
        try:
            store.RunLock(folder).acquire()
        except store.FolderInUse as exc:
            refused.append(exc)

    for _ in range(count):
        thread = threading.Thread(target=take)
        thread.start()
        thread.join()
    return refused


def test_the_lock_refuses_a_call_in_another_thread_of_the_same_process(tmp_path):
    """Two API calls into one folder from two threads both ran (every cell stored twice): the lock was
    re-entrant for the whole process. The thread that holds it may take it again; another may not."""
    import threading

    held = store.RunLock(tmp_path).acquire()
    refused = _refusals_in_threads(tmp_path, 1)
    assert len(refused) == 1 and f"pid {os.getpid()}" in str(refused[0]) and "another thread" in str(refused[0])
    held.release()
    thread = threading.Thread(target=lambda: store.RunLock(tmp_path).acquire().release())
    thread.start()
    thread.join()  # free again: taken and released by that thread
    with store.RunLock(tmp_path):
        pass


def test_an_exclusive_lock_is_never_re_entered_nor_re_enters(tmp_path):
    """A recording holds its folder across the user's loop, between calls of anything in the same
    thread: a second ``StepRecorder(force=True)``, or a ``run_grid(force=True)`` in that thread, re-entered
    its lock and removed the open recording's steps."""
    recording = store.RunLock(tmp_path, exclusive=True).acquire()
    for second in (store.RunLock(tmp_path), store.RunLock(tmp_path, exclusive=True)):
        with pytest.raises(store.FolderInUse, match="a recording open in this process"):
            second.acquire()
    recording.release()
    run = store.RunLock(tmp_path).acquire()
    with pytest.raises(store.FolderInUse, match="a run of this process"):
        store.RunLock(tmp_path, exclusive=True).acquire()
    run.release()
    assert not (tmp_path / store.LOCK_FILE).exists()


def test_a_lock_a_finished_thread_left_held_is_not_re_entered_by_a_thread_that_reuses_its_id(tmp_path):
    """Python hands a finished thread's id to the next thread: the lock told its holder by that id."""
    import threading

    left: list = []
    thread = threading.Thread(target=lambda: left.append(store.RunLock(tmp_path).acquire()))
    thread.start()
    thread.join()
    assert len(_refusals_in_threads(tmp_path, 3)) == 3  # each thread may get the finished one's id
    left[0].release()


def test_the_lock_note_names_only_the_pid_and_is_gone_after_release(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fusedce-profile", "grid", "--out", str(tmp_path)])
    with store.RunLock(tmp_path):
        note = (tmp_path / store.LOCK_FILE).read_text()
        assert note.startswith(f"pid {os.getpid()} since ")
        assert socket.gethostname() not in note and str(tmp_path) not in note and "grid" not in note
    assert not (tmp_path / store.LOCK_FILE).exists()


def test_a_killed_holder_leaves_a_folder_the_next_run_can_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from fusedce_profiler.instrument import store; "
                               f"store.RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(store.FolderInUse, match=f"in use by pid {holder.pid}"):
            store.RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with store.RunLock(tmp_path):  # the stale note is rewritten by the new holder
        assert (tmp_path / store.LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EPERM])
def test_a_folder_that_takes_no_new_file_names_the_file_not_a_temporary_never_made(tmp_path, monkeypatch, code):
    """``report`` with no inode left, or a ``plots/`` it may not write, named
    ``plots/.peak_memory.png.1cf16sus.tmp``, which does not exist."""
    import tempfile

    def refused(prefix, suffix, dir):
        raise OSError(code, os.strerror(code), os.path.join(dir, f"{prefix}1cf16sus{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(OSError) as failed:
        store.write_bytes(tmp_path / "peak_memory.png", b"png")
    assert failed.value.filename == str(tmp_path / "peak_memory.png") and failed.value.errno == code
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    (tmp_path / "report.html").write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as failed:
        store.write_text(tmp_path / "report.html", "new")
    assert failed.value.filename == str(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text() == "old" and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(OSError) as failed:
        store.append_jsonl(tmp_path / store.RESULTS_FILE, {"a": 1})
    assert failed.value.filename == str(tmp_path / store.RESULTS_FILE) and failed.value.errno == errno.ENOSPC


def test_appending_through_a_link_is_refused_naming_it(tmp_path):
    (tmp_path / "elsewhere.jsonl").write_text("")
    (tmp_path / store.RESULTS_FILE).symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(OSError) as refused:
        store.append_jsonl(tmp_path / store.RESULTS_FILE, {"a": 1})
    assert refused.value.errno == errno.ELOOP and refused.value.filename == str(tmp_path / store.RESULTS_FILE)
    assert (tmp_path / "elsewhere.jsonl").read_text() == ""


def test_cutting_a_partial_line_never_truncates_a_linked_file(tmp_path):
    folder = tmp_path / "run"
    outside = link_out(folder, store.RESULTS_FILE)
    with pytest.raises(confined.FolderRefused, match="a symbolic link"):
        store.cut_partial_line(folder / store.RESULTS_FILE)
    assert outside.read_bytes() == UNTOUCHED


def test_cutting_a_partial_line_keeps_every_whole_line(tmp_path):
    path = tmp_path / store.RESULTS_FILE
    path.write_bytes(b'{"a": 1}\n' * 20000 + b'{"a": ')  # longer than one block read from the end
    assert store.cut_partial_line(path)
    assert path.read_bytes() == b'{"a": 1}\n' * 20000
    assert not store.cut_partial_line(path)


@pytest.mark.parametrize("name", [store.ENVIRONMENT_FILE, store.PLAN_FILE, "snapshots/a.timeline.json"])
def test_a_linked_json_file_is_refused_naming_the_link(tmp_path, name):
    secret = tmp_path / "credentials.json"
    secret.write_text('{"token": "s3cret"}')
    folder = tmp_path / "run"
    (folder / name).parent.mkdir(parents=True)
    (folder / name).symlink_to(secret)
    with pytest.raises(confined.FolderRefused, match=f"{folder / name}: a symbolic link"):
        store.read_json(folder / name, inside=folder)


def test_a_file_under_a_linked_folder_is_refused_naming_the_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.timeline.json").write_text("{}")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / store.SNAPSHOTS_DIR).symlink_to(elsewhere)
    with pytest.raises(confined.FolderRefused, match=f"{folder / store.SNAPSHOTS_DIR}: a symbolic link"):
        store.read_json(folder / store.SNAPSHOTS_DIR / "a.timeline.json", inside=folder)


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / store.ENVIRONMENT_FILE
    path.write_bytes(b'{"pad": "' + b"x" * confined.SIZE_LIMITS[store.ENVIRONMENT_FILE] + b'"}')
    with pytest.raises(confined.FolderRefused, match=rf"{path}: \d+ bytes, over the limit of 1048576 bytes"):
        store.read_json(path)


def test_deep_nesting_is_refused_in_one_line_and_brackets_in_strings_do_not_count(tmp_path):
    path = tmp_path / store.PLAN_FILE
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(confined.FolderRefused, match=f"nested deeper than the limit of {confined.MAX_NESTING}"):
        store.read_json(path)
    path.write_text(json.dumps({"cells": ["[" * 5000, "{\\\"[["]}))
    assert store.read_json(path)["cells"][0] == "[" * 5000


def test_a_results_line_over_its_limit_is_refused_and_the_file_is_never_read_whole(tmp_path, monkeypatch):
    path = tmp_path / store.RESULTS_FILE
    path.write_bytes(b'{"a": 1}\n' + b" " * (confined.MAX_LINE_BYTES + 10) + b"\n")
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read whole"))
    with pytest.raises(confined.FolderRefused, match=f"{path}:2: a line over the limit"):
        store.read_jsonl(path, dict)
    path.write_bytes(b'{"a": 1}\n[[1]]\n{"a": ')
    loaded = store.read_jsonl(path, dict)
    assert [r["a"] for r in loaded.records] == [1]
    assert [p.line for p in loaded.skipped] == [2, 3] and "cut short" in loaded.skipped[1].reason


def test_written_files_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        store.write_text(tmp_path / "summary.md", "x")
        store.append_jsonl(tmp_path / store.RESULTS_FILE, {"a": 1})
    finally:
        os.umask(previous)
    assert (tmp_path / "summary.md").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / store.RESULTS_FILE).stat().st_mode & 0o777 == 0o644


def test_writing_into_a_linked_subfolder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "plots").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic link"):
        store.write_text(folder / "plots" / "x.png", "x")
    assert not list(elsewhere.iterdir())


def test_a_process_forked_while_the_lock_is_held_does_not_keep_it(tmp_path):
    """A DataLoader worker forked during a recorded run kept the folder locked after the recorder
    released it: ``report`` of the folder said another process held it while training went on."""
    import signal

    lock = store.RunLock(tmp_path).acquire()
    child = os.fork()
    if child == 0:  # the worker: alive, doing nothing with the folder
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        lock.release()
        other = subprocess.run([sys.executable, "-c", "from fusedce_profiler.instrument import store; "
                                f"store.RunLock({str(tmp_path)!r}).acquire()"], capture_output=True, text=True,
                               timeout=120)
        assert other.returncode == 0, other.stderr
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_report_of_a_folder_a_live_run_holds_before_its_first_record_names_the_holder(tmp_path):
    """A live doctor or explain stores its first record late: ``report`` of its folder said "no
    results.jsonl, … here" instead of naming the run that holds it."""
    from fusedce_profile.errors import UsageError
    from fusedce_profile.report import report_command

    folder = tmp_path / "d"
    folder.mkdir()
    lock = store.RunLock(folder).acquire()
    try:
        with pytest.raises(UsageError, match=f"is in use by pid {os.getpid()}.*: a run is still writing into it"):
            report_command(folder)
    finally:
        lock.release()
    with pytest.raises(UsageError, match="no results.jsonl, .* here"):
        report_command(folder)


def test_a_lock_released_twice_holds_no_signal_back_the_second_time(tmp_path, monkeypatch):
    """A closed recorder's finalizer releases its lock again when a garbage collection runs it, anywhere: the
    release held the main thread's signals back and delivered a Ctrl-C inside the finalizer, where Python drops its
    exception ("Exception ignored in …") — the interrupt lost."""
    from fusedce_profiler.instrument import deferred_signals, runlock

    lock = store.RunLock(tmp_path).acquire()
    lock.release()
    held_back = []
    real = deferred_signals.deferred
    monkeypatch.setattr(runlock.deferred_signals, "deferred", lambda *a, **k: held_back.append(1) or real(*a, **k))
    lock.release()
    assert held_back == [] and not (tmp_path / ".lock").exists()
