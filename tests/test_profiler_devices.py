"""The grid spread over several devices, on the CPU with fake ones.

A "device" is a ``CUDA_VISIBLE_DEVICES`` value; on the CPU the cells ignore it, but every
worker is started with it, so test back-ends (a module on ``sys.path``, as in
``tests/test_profiler_runner.py``) read it to say where they ran or to fail there. A device
named ``broken`` has a worker that dies at start-up (a ``sitecustomize`` on the workers'
path exits when it sees it).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from fusedce_profiler.grid.spec import GridSpec
from fusedce_profiler.grid.runner import load_results, run_grid
from fusedce_profiler.instrument.store import ENVIRONMENT_FILE, RESULTS_FILE

BACKENDS = textwrap.dedent('''
    import os
    import torch.nn.functional as F

    def where(hidden, weight, target, bias=None):
        with open(os.environ["PROFILER_TEST_LOG"], "a") as fh:
            fh.write(f"{os.environ['CUDA_VISIBLE_DEVICES']} {os.getpid()} {hidden.shape[0]}\\n")
        return F.cross_entropy(F.linear(hidden, weight, bias), target)

    def crash_at_12(hidden, weight, target, bias=None):
        if hidden.shape[0] == 12:
            os._exit(3)
        return where(hidden, weight, target, bias)
''')
SITECUSTOMIZE = 'import os\nif os.environ.get("CUDA_VISIBLE_DEVICES") == "broken":\n    os._exit(7)\n'
TOKENS = (8, 10, 12, 14)


@pytest.fixture
def backends(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "profiler_device_backends.py").write_text(BACKENDS)
    (package / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.syspath_prepend(str(package))
    log = tmp_path / "where.log"
    monkeypatch.setenv("PROFILER_TEST_LOG", str(log))
    return "profiler_device_backends", log


def _grid(backend: str) -> GridSpec:
    return GridSpec(tokens=TOKENS, vocab=(32,), hidden=(4,), backends=(backend,), modes=("fp32",), device="cpu",
                    warmup=0, repeats=1)


def _where(log) -> dict[int, set[str]]:
    """tokens → the devices whose workers measured that cell (warm-up and timed steps alike)."""
    seen: dict[int, set[str]] = {}
    for line in log.read_text().splitlines():
        device, _, tokens = line.split()
        seen.setdefault(int(tokens), set()).add(device)
    return seen


def _lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]


def test_cells_spread_over_the_devices_each_appended_once(tmp_path, backends):
    module, log = backends
    out = tmp_path / "out"
    seen = []
    run = run_grid(_grid(f"{module}:where"), out, devices=["a", "b"], on_cell=seen.append)
    assert [r.spec.tokens for r in run.results] == list(TOKENS)  # grid order
    assert all(r.status == "ok" for r in run.results) and len(seen) == len(TOKENS)
    assert sorted(line["spec"]["tokens"] for line in _lines(out)) == list(TOKENS)
    where = _where(log)
    assert all(len(devices) == 1 for devices in where.values()), where  # each cell on one device
    assert set().union(*where.values()) == {"a", "b"}  # both used
    assert json.loads((out / ENVIRONMENT_FILE).read_text())["torch"]

    again = run_grid(_grid(f"{module}:where"), out, devices=["a", "b"], resume=True)  # --resume unchanged
    assert again.resumed == len(TOKENS) and again.results == run.results
    assert len(_lines(out)) == len(TOKENS)


def test_a_failing_cell_and_a_device_that_cannot_start_fail_alone(tmp_path, backends):
    module, log = backends
    run = run_grid(_grid(f"{module}:crash_at_12"), tmp_path / "out", devices=["broken", "a", "b"])
    status = {r.spec.tokens: r.status for r in run.results}
    assert status == {t: "error" if t == 12 else "ok" for t in TOKENS}
    assert "exited with code 3" in next(r.message for r in run.results if r.spec.tokens == 12)
    assert len(_lines(tmp_path / "out")) == len(TOKENS)
    assert set().union(*_where(log).values()) <= {"a", "b"}
    assert [note for note in run.notes if "device broken" in note and "exited with code 7" in note], run.notes


def test_cells_are_errors_when_no_device_starts(tmp_path, backends):
    module, _ = backends
    run = run_grid(_grid(f"{module}:where"), tmp_path / "out", devices=["broken"])
    assert [r.status for r in run.results] == ["error"] * len(TOKENS)
    assert "no device could start a worker" in run.results[0].message
    assert [r.status for r in load_results(tmp_path / "out").records] == ["error"] * len(TOKENS)


def test_ctrl_c_stops_every_device_and_leaves_whole_lines(tmp_path, backends):
    module, _ = backends

    def interrupt(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(_grid(f"{module}:where"), tmp_path / "out", devices=["a", "b"], on_cell=interrupt)
    text = (tmp_path / "out" / RESULTS_FILE).read_text()
    assert text.endswith("\n") and 1 <= len(text.splitlines()) <= 2


def test_no_devices_is_refused(tmp_path):
    with pytest.raises(ValueError, match="devices"):
        run_grid(_grid("torch"), tmp_path / "out", devices=[])
