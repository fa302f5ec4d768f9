"""The suite and the packaging: no process left behind, ignore rules, optional Triton off-GPU."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import REPO

LEAK = "FUSEDCE_TEST_LEAK_A_WORKER"


@pytest.mark.skipif(not os.environ.get(LEAK), reason="run only by the test below, in a pytest of its own")
def test_leaks_a_worker_on_request(tmp_path):
    from fusedce_profiler.instrument.worker import Worker

    worker = Worker(tmp_path / "logs")  # never closed
    worker.call("environment", timeout_s=120)  # started and serving
    test_leaks_a_worker_on_request.worker = worker
    print(f"WORKER_PID={worker.pid}")


def test_the_session_fails_when_a_test_leaves_a_worker_alive():
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         f"{__file__}::test_leaks_a_worker_on_request"],
        cwd=REPO, env={**os.environ, LEAK: "1"}, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert inner.returncode != 0, inner.stdout
    assert "processes started by the tests are still alive" in inner.stdout
    assert "a worker of this test process" in inner.stdout
    pid = int(inner.stdout.split("WORKER_PID=")[1].split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # it dies with its session
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_gitignore_ignores_the_folders_runs_write():
    rules = (REPO / ".gitignore").read_text().splitlines()
    assert "/fusedce-profile-*/" in rules and "/fusedce-report-*/" not in rules


def test_triton_is_optional_off_gpu_and_kept_for_the_interpreter_tests():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("triton") for dep in project["dependencies"])
    assert any(dep.startswith("triton") for dep in project["optional-dependencies"]["test"])
    assert any(dep.startswith("triton") for dep in project["optional-dependencies"]["triton"])


def test_fusedce_runs_on_the_cpu_without_triton():
    script = ("import sys; sys.modules['triton'] = None\n"  # as if triton were not installed
              "import torch, fusedce\n"
              "h = torch.randn(8, 16, requires_grad=True); w = torch.randn(32, 16, requires_grad=True)\n"
              "fusedce.linear_cross_entropy(h, w, torch.randint(0, 32, (8,))).backward()\n"
              "print('ok', h.grad.shape)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")
