"""The grid runner: results file, resume, and cells that run out of memory or kill their worker.

Test back-ends live in a module written to a temporary folder on ``sys.path`` (workers get the
parent's ``sys.path``) and are named ``"module:callable"``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
import textwrap
import time

import pytest

from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.instrument.protocol import CPU_WORKER_ENV
from fusedce_profiler.instrument.records import CellResult
from fusedce_profiler.grid.runner import load_results, run_grid
from fusedce_profiler.instrument.store import ENVIRONMENT_FILE, RESULTS_FILE
from processes import workers_of as _workers_of

BACKENDS = textwrap.dedent('''
    import os, time
    import torch
    import torch.nn.functional as F

    def ok(hidden, weight, target, bias=None):
        return F.cross_entropy(F.linear(hidden, weight, bias), target)

    def oom(hidden, weight, target, bias=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity")

    def crash(hidden, weight, target, bias=None):
        print("about to die", flush=True)
        os._exit(3)

    def in_worker_env(hidden, weight, target, bias=None):
        from fusedce_profiler.instrument.protocol import CPU_WORKER_ENV
        for name, value in CPU_WORKER_ENV.items():
            if os.environ.get(name) != value:
                raise RuntimeError(f"{name}={os.environ.get(name)!r} in the worker, not {value!r}")
        return ok(hidden, weight, target, bias)

    def parks_when_large(hidden, weight, target, bias=None):
        if hidden.shape[0] > 16 and os.environ.get("PROFILER_TEST_PARK"):  # wait for the kill, then exit
            parent = os.getppid()
            while os.getppid() == parent:
                time.sleep(0.05)
            os._exit(0)
        return ok(hidden, weight, target, bias)
''')


@pytest.fixture
def test_backends(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "profiler_test_backends.py").write_text(BACKENDS)
    monkeypatch.syspath_prepend(str(package))
    return "profiler_test_backends"


def _grid(*backends, tokens=(8, 16)):
    return GridSpec(tokens=tokens, vocab=(32,), hidden=(4,), backends=backends, modes=("fp32",), device="cpu",
                    warmup=0, repeats=1)


def test_grid_writes_one_line_per_cell_and_the_environment(tmp_path, test_backends):
    seen: list[CellResult] = []
    results = run_grid(_grid("torch", f"{test_backends}:ok"), tmp_path / "out", on_cell=seen.append).results
    assert [r.status for r in results] == ["ok"] * 4
    assert seen == results
    assert load_results(tmp_path / "out").records == results
    environment = json.loads((tmp_path / "out" / ENVIRONMENT_FILE).read_text())
    assert environment["torch"] and environment["backends"]["torch"] == environment["torch"]


def test_each_cell_is_announced_before_it_is_measured_and_reported_after(tmp_path):
    events: list[tuple[str, int]] = []
    run_grid(_grid("torch"), tmp_path / "out", on_start=lambda spec: events.append(("start", spec.tokens)),
             on_cell=lambda result: events.append(("done", result.spec.tokens)))
    assert events == [("start", 8), ("done", 8), ("start", 16), ("done", 16)]


def test_ctrl_c_stops_the_grid_and_leaves_whole_lines(tmp_path):
    def interrupt(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(_grid("torch"), tmp_path / "out", on_cell=interrupt)
    assert [r.spec.tokens for r in load_results(tmp_path / "out").records] == [8]
    assert (tmp_path / "out" / RESULTS_FILE).read_text().endswith("\n")


def test_existing_results_are_not_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULTS_FILE).write_text("{}\n")
    with pytest.raises(FileExistsError, match="resume"):
        run_grid(_grid("torch"), out)


def test_oom_and_crash_are_recorded_and_the_grid_goes_on(tmp_path, test_backends):
    grid = _grid(f"{test_backends}:oom", f"{test_backends}:crash", "torch", tokens=(8,))
    oom, crash, after = run_grid(grid, tmp_path / "out").results
    assert oom.status == "oom" and oom.oom_requested_bytes == int(2.5 * 2**30)
    assert crash.status == "error"
    assert "exited with code 3" in crash.message and "about to die" in crash.message
    assert after.status == "ok"  # on a fresh worker
    assert crash.log_path and (tmp_path / "out" / crash.log_path).is_file()
    assert [r.status for r in load_results(tmp_path / "out").records] == ["oom", "error", "ok"]


def test_unsupported_cells_are_skipped_without_a_worker(tmp_path, monkeypatch):
    # an importable stand-in for liger-kernel: the cell is skipped for its device, not its absence
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    (cell,) = run_grid(_grid("liger", tokens=(8,)), tmp_path / "out").results
    assert cell.status == "skipped" and "cuda" in cell.message


def test_resume_after_a_killed_run_measures_only_the_missing_cells(tmp_path, test_backends):
    out = tmp_path / "out"
    grid = _grid(f"{test_backends}:parks_when_large", tokens=(8, 32))
    script = ("from fusedce_profiler.grid.spec import GridSpec\nfrom fusedce_profiler.grid.runner import run_grid\n"
              f"run_grid({grid!r}, {str(out)!r})")
    env = {**os.environ, "PROFILER_TEST_PARK": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "pkg"), *sys.path])}
    run = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 120
    while not (out / RESULTS_FILE).exists() or not (out / RESULTS_FILE).read_text():
        assert run.poll() is None and time.monotonic() < deadline, "the first cell never finished"
        time.sleep(0.1)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert _workers_of(run.pid, wait_s=10) == [], "the killed run's worker outlived it"
    with (out / RESULTS_FILE).open("a") as fh:
        fh.write('{"spec": {"backend": "torch", "tok')  # a write cut short by the kill
    loaded = load_results(out)
    assert [r.spec.tokens for r in loaded.records] == [8]
    assert loaded.skipped and "interrupted write" in loaded.problems[0]

    seen: list[CellResult] = []
    run = run_grid(grid, out, resume=True, on_cell=seen.append)
    results = run.results
    assert any("cut a last line" in note for note in run.notes)
    assert [r.spec.tokens for r in seen] == [32]
    assert [(r.spec.tokens, r.status) for r in results] == [(8, "ok"), (32, "ok")]
    lines = (out / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)  # the cut line is gone
    assert json.loads((out / ENVIRONMENT_FILE).read_text())["torch"]  # same environment: kept as is


def test_a_cpu_grids_worker_runs_with_its_environment_without_moving_a_reading(tmp_path, test_backends, monkeypatch):
    for name in CPU_WORKER_ENV:
        monkeypatch.delenv(name, raising=False)
    # blocks of 256 × 4096 fp32 logits (4 MiB): above glibc's default mmap threshold, below the worker's
    grid = GridSpec(tokens=(256,), vocab=(4096,), hidden=(64,), modes=("amp-bf16",), device="cpu", warmup=1,
                    repeats=1, backends=("torch", "fusedce", f"{test_backends}:in_worker_env"))
    tuned = run_grid(grid, tmp_path / "tuned").results
    assert [r.status for r in tuned] == ["ok"] * 3, [r.message for r in tuned]
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):  # the caller's own settings win
        monkeypatch.setenv(name, str(128 << 10))
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    untuned = run_grid(grid, tmp_path / "untuned").results
    assert [r.status for r in untuned] == ["ok", "ok", "error"]
    for a, b in zip(tuned[:2], untuned[:2]):
        assert (a.peak_forward_bytes, a.peak_backward_bytes, a.peak_step_bytes) == (
            b.peak_forward_bytes, b.peak_backward_bytes, b.peak_step_bytes), a.spec.backend


def test_grids_of_several_heads_run_in_one_worker_in_order(tmp_path):
    heads = [GridSpec(tokens=(8, 16), vocab=(vocab,), hidden=(hidden,), backends=("torch",), modes=("fp32",),
                      device="cpu", warmup=0, repeats=1) for hidden, vocab in ((4, 32), (8, 48))]
    run = run_grid(heads, tmp_path / "out")
    assert [(r.spec.hidden, r.spec.tokens, r.status) for r in run.results] == [
        (4, 8, "ok"), (4, 16, "ok"), (8, 8, "ok"), (8, 16, "ok")]
    assert len(list((tmp_path / "out" / "logs").iterdir())) == 1  # one worker served both heads


def test_grids_run_together_must_share_their_settings(tmp_path):
    one = _grid("torch")
    with pytest.raises(ValueError, match="share device, warmup and repeats"):
        run_grid([one, GridSpec(**{**one.__dict__, "repeats": 2})], tmp_path / "out")
