"""A finished run folder names nothing of the machine it ran on, whatever the user's code said.

Each command runs a planted callable whose error (or label) names the run folder, the current
folder, the Python installation, the home folder and the host, as a traceback would; the
run folder sits inside a home-like folder. Every file of the finished folder — records, report
pages, tables, logs, the environment block — is then scanned for those names.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fusedce_cli.app import app

pytestmark = pytest.mark.faults

PLANTED = textwrap.dedent('''
    import os, socket, sys
    import torch

    def where():
        """Where this runs, as a traceback and a careless message would name it."""
        return (f"{os.environ['FX_RUN']}/snapshots/x.pickle in {os.getcwd()}/train.py "
                f"with {sys.prefix}/lib/site.py; home {os.path.expanduser('~')}. host {socket.gethostname()}")

    def boom(hidden, weight, target, bias=None, **options):
        raise RuntimeError("boom: " + where())

    def boom_loss(logits_or_hidden, *args, **kwargs):
        raise RuntimeError("boom: " + where())

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 16)
            self.lm_head = torch.nn.Linear(16, 64, bias=False)

        def forward(self, input_ids):
            return self.lm_head(self.embed(input_ids))

    def builds_once():
        """A model the first time (the command reads its shapes), an error in every step after."""
        mark = os.path.join(os.getcwd(), "built.mark")
        if os.path.exists(mark):
            raise RuntimeError("boom: " + where())
        open(mark, "w").close()
        return Tiny()
''')


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A home folder holding the current folder (with the planted module) and the run folders."""
    home = tmp_path / "home-of-ann"
    work = home / "work"
    work.mkdir(parents=True)
    (work / "fx_planted.py").write_text(PLANTED)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    monkeypatch.setenv("PYTHONPATH", f"{work}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return home


def _stored_text(path: Path) -> str:
    """The strings of a stored JSON or JSON-lines file as text (the store writes JSON with
    non-ASCII characters escaped, the placeholders' ``‹ ›`` among them)."""
    values = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.suffix == ".jsonl" else [json.loads(path.read_text())]
    return json.dumps(values, ensure_ascii=False)


def _run(machine: Path, monkeypatch, name: str, args: list[str]) -> tuple[Path, str]:
    out = machine / "runs" / name
    monkeypatch.setenv("FX_RUN", str(out))
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return out, result.output


def assert_names_no_machine(folder: Path, home: Path) -> None:
    """No file below ``folder`` names the home folder (which holds the run folder and the current
    folder), the Python installation or the host."""
    import fusedce_profiler

    source = Path(fusedce_profiler.__file__).resolve().parents[1]  # a checkout, when installed editable
    leaks = {"home folder": re.escape(str(home)), "real home folder": re.escape(os.path.realpath(home)),
             "Python installation": re.escape(sys.prefix), "tool's source folder": re.escape(f"{source}{os.sep}"),
             "placeholder a page would read as a tag": "<(run folder|cwd|python|host|fusedce)>"}
    host = socket.gethostname()
    if len(host) >= 4:
        leaks["host name"] = rf"(?<![\w.-]){re.escape(host)}(?![\w-])"
    files = [path for path in folder.rglob("*") if path.is_file()]
    assert files
    for path in files:
        text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", path.read_bytes().decode("latin-1"))
        for what, pattern in leaks.items():
            assert not re.search(pattern, text), f"{path.relative_to(folder)} names the {what}"


def test_a_grid_folder_names_no_machine(machine, monkeypatch):
    out, _ = _run(machine, monkeypatch, "grid", ["grid", "--device", "cpu", "--hidden", "32", "--vocab", "256",
                                                  "--tokens", "8", "--repeats", "1", "--warmup", "0", "--backend",
                                                  "torch", "--backend", "fx_planted:boom"])
    assert "boom: ‹run folder›/snapshots/x.pickle in ‹cwd›/train.py with ‹python›/lib/site.py; home ~." in \
        _stored_text(out / "results.jsonl")
    assert (out / "results.csv").is_file() and (out / "report.html").is_file()
    assert_names_no_machine(out, machine)
    monkeypatch.chdir(out)  # rebuilt from inside the folder: the current folder is the run folder
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code in (0, 1)
    assert_names_no_machine(out, machine)


@pytest.mark.parametrize("command, record", [
    (["model", "--device", "cpu", "--preset", "tiny", "--batch", "1", "--seq", "8", "--no-trace", "--backend", "torch",
      "--backend", "fx_planted:boom"], "model_results.jsonl"),
    (["parity", "--device", "cpu", "--preset", "tiny", "--steps", "10", "--batch", "2", "--seq", "8", "--no-control",
      "--backend", "fx_planted:boom"], "parity.json"),
    (["doctor", "--loss", "fx_planted:boom_loss", "--device", "cpu"], "doctor.json"),
    (["explain", "--device", "cpu", "--model", "fx_planted:builds_once", "--seq", "8", "--naive", "3", "--fused", "2",
      "--card", "24", "--attention", "sdpa", "--no-checkpointing", "--no-eval-step"], "explain_steps.jsonl"),
])
def test_a_command_folder_names_no_machine(machine, monkeypatch, command, record):
    out, output = _run(machine, monkeypatch, command[0], command)
    assert "boom: ‹run folder›/" in _stored_text(out / record), output
    assert_names_no_machine(out, machine)


def test_a_recorded_folder_names_no_machine(machine, monkeypatch):
    import torch

    from fusedce_profile import StepRecorder, write_report

    out = machine / "runs" / "recorded"
    label = f"{out} in {os.getcwd()} with {sys.prefix}; home {machine}. host {socket.gethostname()}"
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64, bias=False))
    recorder = StepRecorder(model, out, steps=(0,), label=label)
    ids = torch.randint(0, 64, (2, 8))
    with recorder.step():
        model(ids).sum().backward()
    recorder.close()
    write_report(out)
    stored = [json.loads(line) for line in (out / "recorded_steps.jsonl").read_text().splitlines()]
    assert stored[0]["label"] == "‹run folder› in ‹cwd› with ‹python›; home ~. host " + (
        "‹host›" if len(socket.gethostname()) >= 4 else socket.gethostname())
    assert_names_no_machine(out, machine)


def test_a_pythonpath_folder_and_the_tools_own_source_are_placeholders(tmp_path, monkeypatch):
    """A user's module imported from a PYTHONPATH folder, and fusedce itself run from a checkout,
    put both folders into every traceback a failed cell stores."""
    import fusedce_profiler
    from fusedce_profiler.instrument.scrub import machine_names, scrub_text

    lib = tmp_path / "alice_lib"
    monkeypatch.chdir(tmp_path)  # not the checkout: the current folder is a placeholder of its own
    monkeypatch.setenv("PYTHONPATH", f"{lib}{os.pathsep}relative{os.pathsep}")
    source = Path(fusedce_profiler.__file__).resolve().parents[1]
    text = f'File "{lib}/umod.py", line 3, in boom; File "{source}/profiler/grid/cell.py", line 9; relative/x.py'
    assert scrub_text(text, machine_names()) == \
        'File "‹pythonpath›/umod.py", line 3, in boom; File "‹fusedce›/profiler/grid/cell.py", line 9; relative/x.py'


def test_a_run_folder_written_with_dot_dot_is_a_placeholder_as_written_and_normalised(tmp_path):
    from fusedce_profiler.instrument.scrub import machine_names, scrub_text

    (tmp_path / "sub").mkdir()
    written = f"{tmp_path}/sub/../run"  # as "$DATA/../runs/x" gives in a script
    names = machine_names(written)
    line = f"continue with the same command and --resume --out {written}; report {tmp_path}/run/summary.md"
    assert scrub_text(line, names) == ("continue with the same command and --resume --out ‹run folder›; "
                                       "report ‹run folder›/summary.md")


def test_the_user_name_in_torch_compiles_cache_folder_is_a_placeholder(monkeypatch):
    """A compiled step's trace frames name ``/tmp/torchinductor_USER/…``: the user's name."""
    import getpass

    from fusedce_profiler.instrument.scrub import machine_names, scrub_text

    monkeypatch.setattr(getpass, "getuser", lambda: "annabel")
    frame = "/tmp/torchinductor_annabel/xy/cxyz.py:12 in call; torchinductor_annabelle stays"
    assert scrub_text(frame, machine_names()) == ("/tmp/torchinductor_‹user›/xy/cxyz.py:12 in call; "
                                                  "torchinductor_annabelle stays")


def test_the_current_folder_removed_during_a_run_keeps_its_placeholder(tmp_path, monkeypatch):
    """A build folder cleaned beside a running grid: the names of a result are still scrubbed (the
    folder's name taken at the start), never an error that drops the result."""
    from fusedce_profiler.instrument import scrub

    gone = tmp_path / "build"
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.setattr(scrub, "_FOLDER_AT_START", str(gone))
    gone.rmdir()
    names = scrub.machine_names(tmp_path / "run")
    assert scrub.scrub_text(f"{gone}/x.py and {tmp_path}/run/summary.md", names) == \
        "‹cwd›/x.py and ‹run folder›/summary.md"
