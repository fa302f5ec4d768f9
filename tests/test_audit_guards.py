"""Guards on what the tool runs and what it reads back: a grid back-end's host memory, a stored
row's device, an ``explain --cache`` file shared by a hard link, and a stored parity curve whose
losses are not finite."""
from __future__ import annotations

import json
import time
import textwrap

import pytest

from fusedce_profiler.grid.runner import run_grid
from fusedce_profiler.grid.spec import GridSpec

MiB = 2**20

MEMORY_HOG = textwrap.dedent("""
    import time

    def loss(hidden, weight, target, bias=None, **options):
        # touched memory, 32 MiB a step, until it holds OWN_CAP (so that an unguarded run ends too)
        held = []
        while len(held) * 32 < OWN_CAP_MIB:
            held.append(b"\\x01" * (32 << 20))
            time.sleep(0.01)
        raise RuntimeError("the memory hog reached its own cap: nothing stopped it")
""")


CHILD_HOG = textwrap.dedent("""
    import subprocess, sys

    HOG = ("import time\\nheld = []\\nwhile len(held) * 32 < OWN_CAP_MIB:\\n"
           "    held.append(b'\\\\x01' * (32 << 20))\\n    time.sleep(0.01)\\n")

    def loss(hidden, weight, target, bias=None, **options):
        # a helper process that holds touched memory, 32 MiB a step, up to OWN_CAP (then it ends)
        subprocess.run([sys.executable, "-S", "-c", HOG], check=True)
        raise RuntimeError("the memory hog's helper reached its own cap: nothing stopped it")
""")


FORKING_HOG = CHILD_HOG.replace(
    "time.sleep(0.01)", "time.sleep(0.01)\\n    if os.fork() == 0:\\n        time.sleep(30)\\n        os._exit(0)").replace(
    '"import time', '"import os, time')


@pytest.mark.parametrize("hog", [MEMORY_HOG, CHILD_HOG, FORKING_HOG],
                         ids=["in the worker", "in a process it starts", "shared by that process and its children"])
def test_a_grid_back_end_past_the_memory_guard_is_stopped_and_the_run_goes_on(tmp_path, monkeypatch, hog):
    """A back-end that allocates without bound was stopped only by the kernel's OOM killer; one whose
    helper process did was not stopped at all (the guard read the worker's own memory), nor one whose
    helper forked after each chunk (pages shared by two processes are private to neither)."""
    limit = 768 * MiB  # a CPU worker holds about 400 MiB before its first cell
    (tmp_path / "audit_memory_hog.py").write_text(hog.replace("OWN_CAP_MIB", str(2048)))
    monkeypatch.syspath_prepend(str(tmp_path))
    shape = dict(hidden=(32,), vocab=(256,), modes=("fp32",), device="cpu", warmup=0, repeats=1)
    grids = [GridSpec(tokens=(8,), backends=("torch", "audit_memory_hog:loss"), **shape),
             GridSpec(tokens=(16,), backends=("torch",), **shape)]
    run = run_grid(grids, tmp_path / "run", max_rss_bytes=limit)
    assert [r.status for r in run.results] == ["ok", "error", "ok"], [r.message for r in run.results]
    assert run.results[1].message.startswith("audit_memory_hog:loss grew past the memory limit of 0.75 GiB of host "
                                             "memory (the worker's, with every process it started)")
    assert len(run.results[1].message.splitlines()) == 1 and run.results[1].log_path.startswith("logs/")


@pytest.mark.parametrize("device", ["cuda:0 " + "\x1b[2J" * 3 + "x" * 5000, "A\x1b]0;PWN\x07", "mps", "cuda:", "cuda:²",
                                    "CPU", "cpu\n"])
def test_a_stored_row_of_a_device_no_run_asks_for_is_invalid_naming_its_line(tmp_path, device):
    """``spec.device`` took any string (5000 characters, control characters) into the plot titles."""
    from fusedce_profiler.grid.runner import load_results
    from fusedce_profiler.instrument import store
    from fusedce_profiler.instrument.records import CellResult, CellSpec

    rows = [CellResult(CellSpec("torch", 8, 256, 32, mode="fp32", device=name), status="error", message="boom").to_dict()
            for name in ("cpu", "cuda", "cuda:3", device)]
    (tmp_path / store.RESULTS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = load_results(tmp_path)
    assert [r.spec.device for r in loaded.records] == ["cpu", "cuda", "cuda:3"]
    (problem,) = loaded.problems
    assert problem.startswith(f"{tmp_path / store.RESULTS_FILE}:4: not a valid row (spec.device must be cpu, cuda or "
                              "cuda:K, got "), problem
    assert problem.isprintable() and len(problem) < 400, problem


def test_an_explain_cache_with_a_second_name_is_refused_before_any_step(tmp_path):
    """A hard-linked ``--cache`` was refused by the store only after a calibration step ran."""
    import os

    from typer.testing import CliRunner

    from fusedce_cli.app import app
    from fusedce_profiler.instrument.confined import WRITE_SHARED_REFUSED

    (tmp_path / "steps.jsonl").write_text("")
    cache = tmp_path / "second_name.jsonl"
    os.link(tmp_path / "steps.jsonl", cache)
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["explain", "--naive", "3.2", "--fused", "2.9", "--card", "24", "--device", "cpu",
                                      "--preset", "tiny", "--seq", "32", "--cache", str(cache), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"--cache {cache}: {WRITE_SHARED_REFUSED}" in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("diverged, shown", [
    ("torch", "torch's run diverged: the loss is not finite from step 150, so nothing can be concluded"),
    ("fusedce", "fusedce vs torch: diverged: the loss is not finite from step 150"),
])
def test_a_parity_curve_whose_loss_is_not_finite_is_shown_diverged_never_as_a_pass(tmp_path, diverged, shown):
    """Losses of Infinity were rendered "from inf to inf", "at most nan%", every back-end a pass.
    A run that diverges stores such losses itself (as "Infinity"), so they are read and shown as they are."""
    import shutil
    from pathlib import Path

    from fusedce_reports.parity_report import parity_table, write_parity_report

    run = tmp_path / "parity"
    shutil.copytree(Path(__file__).parent / "fixtures" / "h200_parity", run)
    raw = json.loads((run / "parity.json").read_text())
    curve = next(c for c in raw["curves"] if c["backend"] == diverged)
    curve["losses"][150:] = ["Infinity"] * (len(curve["losses"]) - 150)
    (run / "parity.json").write_text(json.dumps(raw))
    summary, report = write_parity_report(run)
    text = " ".join(summary.read_text().replace("**", "").split())
    assert not report.passed and text.startswith("# fusedce-profile parity: FAIL")
    assert shown in text and "nan" not in text and "inf to" not in text
    fused = parity_table(report).set_index("back-end").loc["fusedce"]
    assert fused["verdict"] == ("not judged" if diverged == "torch" else "FAIL")
    assert "not finite from step 150" in fused["why"]


@pytest.mark.parametrize("cut", ["a back-end did not train", "interrupted"])
def test_a_parity_page_is_headed_pass_only_when_every_back_end_trained(tmp_path, cut):
    """An interrupted run, or one where a back-end never trained, was headed "parity: PASS"."""
    import shutil
    from pathlib import Path

    from fusedce_profiler.instrument.interruption import Interruption, mark_interrupted
    from fusedce_reports.parity_report import write_parity_report

    run = tmp_path / "parity"
    shutil.copytree(Path(__file__).parent / "fixtures" / "h200_parity", run)
    if cut == "interrupted":
        mark_interrupted(run, Interruption("SIGTERM", "2 of 3 back-ends", "the same command"))
        heading = "# fusedce-profile parity: INTERRUPTED"
    else:
        raw = json.loads((run / "parity.json").read_text())
        raw["curves"] = [c for c in raw["curves"] if c["backend"] != "fusedce"]
        raw["verdicts"] = [v for v in raw["verdicts"] if v["backend"] != "fusedce"]
        (run / "parity.json").write_text(json.dumps(raw))
        heading = "# fusedce-profile parity: INCOMPLETE"
    summary, report = write_parity_report(run)
    assert report.passed  # nothing that ran failed
    assert summary.read_text().startswith(heading)


def test_the_memory_guard_counts_a_marked_sibling_and_reads_a_slow_process_by_its_resident_memory(monkeypatch):
    """A helper made a child of the worker's parent (``clone(CLONE_PARENT)``) was outside the tree the
    guard read; a helper whose ``smaps_rollup`` was made slow to read (a vast zero-page mapping)
    stretched the guard's interval, and memory was held between its readings."""
    import os
    import subprocess
    import sys

    from fusedce_profiler.instrument import memory_guard
    from fusedce_profiler.instrument.lifetime import MARK_VARIABLE

    env = {**os.environ, MARK_VARIABLE: "guard-test-mark"}
    hold = ("import time; b = bytearray(256 << 20); b[::4096] = b'\\x01' * len(b[::4096]); print(1, flush=True); "
            "time.sleep(60)")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    sibling = subprocess.Popen([sys.executable, "-c", hold], env=env, stdout=subprocess.PIPE)
    stranger = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE)  # no mark: not the worker's
    try:
        assert sibling.stdout.readline() and stranger.stdout.readline()
        alone = memory_guard.rss_bytes(worker.pid)
        meter = memory_guard.TreeMeter(worker.pid, "guard-test-mark")
        assert 256 * MiB <= meter() - alone < 512 * MiB  # the sibling, not the stranger
        assert memory_guard.TreeMeter(worker.pid)() == memory_guard.rss_bytes(worker.pid)  # no mark, no sibling
        monkeypatch.setattr(memory_guard, "SLOW_READING_S", -1.0)  # every reading "slow"
        meter()
        assert meter._slow == {sibling.pid} and meter() - alone >= 256 * MiB  # then read by its resident memory
    finally:
        for process in (worker, sibling, stranger):
            process.kill()
            process.wait(timeout=30)


def test_the_guard_reads_each_siblings_environment_once_the_largest_first_within_its_time(monkeypatch):
    """800 idle helpers beside the worker, each with a 1.9 MiB environment, made every reading of the guard
    5–7 s long (each environment read again at every poll): 1.5 GiB held between two readings passed
    ``--memory-limit 1``. Each environment is now read once, the largest processes first, for at most
    ``SIBLING_SCAN_S`` a reading."""
    from fusedce_profiler.instrument import memory_guard

    helpers = list(range(1000, 1800))
    hog = 1799  # made last, the largest, bearing the mark
    reads: list[int] = []

    def slow_read(pid, entry):
        reads.append(pid)
        time.sleep(0.002)
        return pid == hog

    monkeypatch.setattr(memory_guard, "children_of", lambda parent: [7, *helpers])
    monkeypatch.setattr(memory_guard, "started", lambda pid: 100 + pid)
    monkeypatch.setattr(memory_guard, "rss_bytes", lambda pid: (2 << 30) if pid == hog else 4 << 20)
    monkeypatch.setattr(memory_guard, "holds_entry", slow_read)
    monkeypatch.setattr(memory_guard, "descendants", lambda pid: [])
    monkeypatch.setattr(memory_guard, "_proportional_bytes", lambda pid: (2 << 30) if pid == hog else 0)
    monkeypatch.setattr("builtins.open", _stat_of_a_worker_whose_parent_is(5), raising=True)
    meter = memory_guard.TreeMeter(7, "the-mark")
    began = time.monotonic()
    assert meter._marked_siblings() == [hog]  # the largest is read first
    assert time.monotonic() - began < 0.5 and len(reads) < 50
    while len(reads) < len(helpers):
        meter._marked_siblings()
    assert sorted(reads) == helpers  # every environment read once, never again
    assert meter._marked_siblings() == [hog] and len(reads) == len(helpers)


def _stat_of_a_worker_whose_parent_is(parent: int):
    import builtins
    import io

    real_open = builtins.open

    def fake(path, *args, **kwargs):
        if path == "/proc/7/stat":
            return io.StringIO(f"7 (python) S {parent} 7 7 0 -1")
        return real_open(path, *args, **kwargs)
    return fake
