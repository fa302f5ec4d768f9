"""profiler/store.py: the run-folder lock, and writes that fail name their file."""
import errno
import os
import subprocess
import sys

import pytest

from processes import REPO
from fusedce_profiler.instrument import store


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


def test_the_lock_file_holds_the_whole_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fusedce-profile", "grid", "--tokens", ",".join(["1024"] * 60)])
    with store.RunLock(tmp_path):
        assert (tmp_path / store.LOCK_FILE).read_text().rstrip().endswith(",1024)")


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
