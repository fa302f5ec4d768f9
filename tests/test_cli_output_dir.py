"""The run folder: time-stamped by default, never overwritten without --force."""
import datetime as dt

import pytest

from fusedce_profile.folders import OutputDirError, default_out_dir, prepare_out_dir
from run_records import plant_environment


def test_default_folder_is_time_stamped_and_never_reused(tmp_path):
    now = dt.datetime(2026, 12, 2, 14, 5, 9)
    first = default_out_dir(now, parent=tmp_path)
    assert first.name == "fusedce-profile-20261202-140509"
    first.mkdir()
    assert default_out_dir(now, parent=tmp_path).name == "fusedce-profile-20261202-140509-2"


def test_non_empty_folder_needs_force_or_resume(tmp_path):
    plant_environment(tmp_path)
    (tmp_path / "results.jsonl").write_text("{}\n")
    with pytest.raises(OutputDirError, match="not empty; pass --force"):
        prepare_out_dir(tmp_path, force=False, resume=False)
    assert prepare_out_dir(tmp_path, force=False, resume=True) == tmp_path
    assert (tmp_path / "results.jsonl").exists()  # resume keeps the results


def test_force_removes_the_previous_run_but_not_other_files(tmp_path):
    plant_environment(tmp_path)
    (tmp_path / "results.jsonl").write_text("{}\n")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "time.png").write_bytes(b"png")
    (tmp_path / "my-notes.txt").write_text("keep me")
    prepare_out_dir(tmp_path, force=True, resume=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-notes.txt"]


@pytest.mark.parametrize("kwargs, message", [
    ({"force": True, "resume": True}, "contradict"),
    ({"force": False, "resume": True}, "--resume needs --out"),
])
def test_contradictory_or_incomplete_choices_are_errors(kwargs, message):
    with pytest.raises(OutputDirError, match=message):
        prepare_out_dir(None, **kwargs)


def test_a_file_is_not_a_run_folder(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(OutputDirError, match="not a folder"):
        prepare_out_dir(path, force=True, resume=False)


def test_a_folder_holding_only_a_lock_file_is_empty(tmp_path):
    (tmp_path / ".lock").write_text("pid 1 on host")
    assert prepare_out_dir(tmp_path, force=False, resume=False) == tmp_path


def test_the_lock_is_taken_before_force_removes_anything(tmp_path):
    plant_environment(tmp_path)
    (tmp_path / "results.jsonl").write_text("{}\n")

    def held(folder):
        raise OutputDirError(f"{folder} is in use by pid 1")

    with pytest.raises(OutputDirError, match="in use"):
        prepare_out_dir(tmp_path, force=True, resume=False, lock=held)
    assert (tmp_path / "results.jsonl").exists()


def test_force_removes_a_linked_artefact_without_following_it(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.png").write_bytes(b"png")
    run = tmp_path / "run"
    run.mkdir()
    (run / "plots").symlink_to(target)
    plant_environment(run)
    prepare_out_dir(run, force=True, resume=False)
    assert not list(run.iterdir()) and (target / "keep.png").exists()


def test_force_removes_a_pipe_holding_a_run_files_name(tmp_path):
    """``model --force`` left a named pipe as ``fit.json`` (or ``interrupted.json``), measured every job,
    then refused to write the report its own folder would need."""
    import os

    run = tmp_path / "run"
    run.mkdir()
    for name in ("fit.json", "interrupted.json", "results.jsonl"):
        os.mkfifo(run / name)
    (run / "model_results.jsonl").write_text("")
    plant_environment(run)
    prepare_out_dir(run, force=True, resume=False)
    assert not list(run.iterdir())
