"""Test session set-up.

Without CUDA, Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) on CPU
tensors. The variable is read when a kernel is decorated, so it is set here, before any
test module imports ``fusedce``.
"""
import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A suite started in the background of a non-interactive shell (`cmd &` in a script) inherits an
# ignored SIGINT, and so would every command line a test starts: the tests of Ctrl-C need it delivered.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite runs many tiny ops; on a small shared CI machine one intra-op thread avoids
# thread hand-off costs that dominate at these sizes.
torch.set_num_threads(1)

# --- how many test processes `-n auto` starts (pytest-xdist) ----------------------------------
MAX_TEST_PROCESSES = 4
"""On the CPU, ``-n auto`` starts one test process per core up to this many: most tests wait on
worker processes of their own (each importing torch), so two cores run the suite in about half the
time of one, and more processes than this only add memory."""


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one process per core up to :data:`MAX_TEST_PROCESSES`; none beside the main one
    on a machine with CUDA, whose tests measure one GPU's memory and time and must not share it."""
    if _HAS_CUDA:
        return 0
    return max(1, min(MAX_TEST_PROCESSES, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


# --- no process left behind -----------------------------------------------------------------
# Every process this session starts inherits the marker, so one that outlived its parent is
# found even after it was reparented. At the end of the session none may be alive.
import uuid  # noqa: E402

import pytest  # noqa: E402

from processes import SESSION_VARIABLE, session_processes, workers_of  # noqa: E402

os.environ[SESSION_VARIABLE] = uuid.uuid4().hex


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Fail the session if a worker (or a CLI run) a test started is still alive at the end."""
    yield
    from fusedce_profiler.instrument.template import close_template, template_pids

    templates = set(template_pids())  # this process's worker templates live as long as it does, by design
    left = {pid: f"pid {pid}: {args}" for pid, args in session_processes(os.environ[SESSION_VARIABLE], wait_s=10,
                                                                         spare=templates)}
    for pid in workers_of(os.getpid()):  # the wait above was long enough
        left[pid] = f"pid {pid}: a worker of this test process"
    close_template()
    if left:
        pytest.fail("processes started by the tests are still alive:\n" + "\n".join(left.values()), pytrace=False)


# --- gradients on after every test --------------------------------------------------------------
@pytest.fixture(autouse=True)
def gradients_left_on():
    """A test that leaves this thread's gradients off (torch's own ``no_grad`` cut by a signal a test sent) fails
    itself, and gradients are turned back on: otherwise every later test of the process that trains fails."""
    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("this test left gradients off in the main thread", pytrace=False)


# --- one finished grid for the whole session ------------------------------------------------
# A tiny CPU grid (two cells of torch) costs a worker's start-up and a report: made once, shared
# by the fault tests of test_cli_faults.py, test_confinement.py and test_report_bounds.py. It is
# never changed: a test that changes a folder works on a copy (``shutil.copytree``).
FINISHED_GRID = ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256", "--repeats", "1", "--warmup", "0",
                 "--tokens", "8,16", "--backend", "torch"]
"""The command line of :func:`finished_run`, without its ``--out``."""


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A finished grid of two cells (:data:`FINISHED_GRID`), made once per session; read it, or copy it."""
    from typer.testing import CliRunner

    from fusedce_cli.app import app

    out = tmp_path_factory.mktemp("finished") / "run"
    result = CliRunner().invoke(app, [*FINISHED_GRID, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out
