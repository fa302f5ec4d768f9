"""Parity trains each curve in a worker: a back-end that exits, raises or hangs ends its own curve
(an ``error`` naming why), never the command; the other back-ends and the report go on."""
from __future__ import annotations

import textwrap

import pytest

from fusedce_profile.parity import parity

BACKENDS = textwrap.dedent('''
    import os, sys, time
    import torch.nn.functional as F

    def exits_0(hidden, weight, target, bias=None, **options):
        sys.exit(0)

    def exits_3(hidden, weight, target, bias=None, **options):
        sys.exit(3)

    def hard_exit_0(hidden, weight, target, bias=None, **options):
        os._exit(0)

    def raises(hidden, weight, target, bias=None, **options):
        raise RuntimeError("planted failure")
''')


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "hostile_parity_backends.py").write_text(BACKENDS)
    monkeypatch.syspath_prepend(str(folder))  # workers get the parent's sys.path
    return "hostile_parity_backends"


def test_back_ends_that_exit_or_raise_fail_their_own_curve_and_the_run_goes_on(hostile, tmp_path):
    names = [f"{hostile}:{name}" for name in ("exits_0", "hard_exit_0", "exits_3", "raises")]
    report = parity(preset="tiny", backend=[*names, "fusedce"], steps=10, batch=2, seq=8, device="cpu",
                    control=False, out=tmp_path / "run")
    verdicts = {v.backend: v for v in report.verdicts}
    assert not report.passed
    for name, why in zip(names, ("exited with code 0", "exited with code 0", "exited with code 3", "planted failure")):
        assert verdicts[name].passed is False, name
        assert why in " ".join(verdicts[name].reasons), (name, verdicts[name].reasons)
    assert verdicts["fusedce"].passed  # trained after them, in a fresh worker
    exited = next(c for c in report.curves if c.backend == names[2])
    assert "; log logs/worker-" in exited.message  # named within the run folder, wherever the command ran
    assert "FAIL" in (tmp_path / "run" / "summary.md").read_text().splitlines()[0]


def test_a_hanging_back_end_is_stopped_at_the_curve_time_limit(tmp_path, monkeypatch):
    import sys

    command = sys.modules["fusedce_profile.parity"]  # the package exports the function under this name
    (tmp_path / "hanging_parity_backend.py").write_text(
        "import time\n\ndef hangs(hidden, weight, target, bias=None, **options):\n    time.sleep(3600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(command, "CURVE_TIMEOUT_S", 15.0)  # torch's own 10 steps need a few seconds on a loaded CPU
    report = parity(preset="tiny", backend=["hanging_parity_backend:hangs"], steps=10, batch=2, seq=8, device="cpu",
                    control=False, out=tmp_path / "run")
    (verdict,) = [v for v in report.verdicts if v.backend.endswith(":hangs")]
    assert verdict.passed is False and "did not finish within 15 s" in " ".join(verdict.reasons)


def test_the_log_a_failed_curves_line_names_opens_from_where_the_command_ran(hostile, tmp_path, monkeypatch):
    """The terminal printed the stored message, whose log is named within the run folder (``logs/worker-…``):
    from the command's folder that path did not exist (``model`` and ``grid`` alike; the page keeps it)."""
    import io
    import re
    from pathlib import Path

    from rich.console import Console

    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    parity(preset="tiny", backend=[f"{hostile}:exits_3"], steps=10, batch=2, seq=8, device="cpu", control=False,
           out="run", console=Console(file=printed, width=400))
    logs = re.findall(r"\blog (\S+\.log)", printed.getvalue())
    assert logs and all(Path(log).is_file() for log in logs), printed.getvalue()


def test_a_terminal_line_names_the_whole_log_from_here_however_long_or_strange_the_folder():
    """The shortening of a long line cut the log's path (``log…``), and a newline in the folder's name split
    the line."""
    from pathlib import Path

    from fusedce_profiler.instrument.worker_errors import line_naming_log

    folder = Path("/runs/" + "d" * 150 + "/new\nline")
    line = line_naming_log("the worker exited with code 7 (" + "why " * 60 + "); log logs/worker-1.log:\ntail",
                           folder, 100)
    assert line.endswith(f"; log /runs/{'d' * 150}/new\\nline/logs/worker-1.log") and "\n" not in line
    assert len(line.split("; log ")[0]) <= 101
