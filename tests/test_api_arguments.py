"""The commands' Python functions refuse an argument of the wrong kind (a number for a name or a
path, a number for a list) as the command line does: one ``UsageError`` naming the option, before
any folder is made (:mod:`fusedce_profile.arguments`), never a ``TypeError`` from inside."""
from __future__ import annotations

import os
import re
import types

import pytest
import torch
from rich.console import Console

import fusedce_profile as fp
from fusedce_profile.errors import UsageError

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

CPU = {"device": "cpu"}
EXPLAIN = {"naive": 3.2, "fused": 2.9, "card": 24, **CPU}
LOSS = {"loss": "test_model_doctor:correct"}
CONSOLE = "expected a rich.console.Console (made with Console()), or None"
CLOSED = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed at once: a console that cannot print
CLOSED.file.close()


@pytest.mark.parametrize("function, arguments, line", [
    ("run_grid", {"backend": 5, **CPU}, "--backend 5: expected a name or a list of names"),
    ("run_grid", {"mode": 7, **CPU}, "--mode 7: expected a name or a list of names"),
    ("run_grid", {"devices": 5, **CPU}, "--devices 5: expected a name or a list of names"),
    ("run_grid", {"device": 3}, "--device 3: expected a string"),
    ("run_grid", {"config": 5, **CPU}, "--config 5: expected a path"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "out": 5}, "--out 5: expected a path"),
    ("profile_model", {"backend": [5], **CPU}, "--backend [5]: expected a name or a list of names"),
    ("profile_model", {"hf": 5, **CPU}, "--hf 5: expected a string"),
    ("profile_model", {"model": 5, **CPU}, "--model 5: expected a string"),
    ("profile_model", {"config": 5, **CPU}, "--config 5: expected a path"),
    ("parity", {"config": 3, **CPU}, "--config 3: expected a path"),
    ("parity", {"device": 3}, "--device 3: expected a string"),
    ("doctor", {**LOSS, "model": 5, **CPU}, "--model 5: expected a string"),
    ("doctor", {**LOSS, "device": 5}, "--device 5: expected a string"),
    ("explain", {**EXPLAIN, "out": 5}, "--out 5: expected a path"),
    ("build_report", {"run_dir": 5}, "DIR 5: expected a path"),
    ("build_report", {"run_dir": None}, "DIR: expected the folder a run wrote, got None"),
    # a flag is True or False: force="no" from a settings file replaced the run in out
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "force": "no"},
     "--force 'no': expected True or False"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "resume": "false"},
     "--resume 'false': expected True or False"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "snapshot": 1},
     "--snapshot 1: expected True or False"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "bias": "yes"},
     "--bias 'yes': expected True or False"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "console": "x"},
     f"console 'x': {CONSOLE}"),
    ("profile_model", {"trace": "0", **CPU}, "--trace '0': expected True or False"),
    ("profile_model", {"tied": "no", **CPU}, "--tied 'no': expected True or False (or None)"),
    ("profile_model", {"force": "no", **CPU}, "--force 'no': expected True or False"),
    ("profile_model", {"console": 3, **CPU}, f"console 3: {CONSOLE}"),
    ("parity", {"control": "no", **CPU}, "--control 'no': expected True or False"),
    ("parity", {"resume": "no", **CPU}, "--resume 'no': expected True or False"),
    ("doctor", {**LOSS, "tied": 1, **CPU}, "--tied 1: expected True or False (or None)"),
    ("doctor", {**LOSS, "force": "no", **CPU}, "--force 'no': expected True or False"),
    ("explain", {**EXPLAIN, "force": "no"}, "--force 'no': expected True or False"),
    ("build_report", {"run_dir": ".", "console": "x"}, f"console 'x': {CONSOLE}"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "console": CLOSED},
     "console: its file is closed (nothing could be printed)"),
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "console": Console},
     f"console <class 'rich.console.Console'>: {CONSOLE}"),  # the class, its () forgotten
    ("run_grid", {"tokens": [8], "hidden": [32], "vocab": [64], **CPU, "console": types.SimpleNamespace(print=print)},
     f"console namespace(print=<built-in function pr...: {CONSOLE}"),
])
def test_an_argument_of_the_wrong_kind_is_a_usage_error_naming_it(function, arguments, line, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default folder would land here
    with pytest.raises(UsageError) as refused:
        getattr(fp, function)(**arguments)
    assert str(refused.value) == line
    assert not any(tmp_path.iterdir())  # refused before any folder was made


class BrokenSteps:
    """An iterable whose iteration raises (a user's generator that fails)."""

    def __iter__(self):
        raise RuntimeError("iteration broke")

    def __repr__(self):
        return "broken steps"


@pytest.mark.parametrize("options, line", [
    ({"report": "no"}, "report 'no': expected True or False"),
    ({"force": "no"}, "force 'no': expected True or False"),
    ({"trace": 0}, "trace 0: expected True or False"),
    ({"force": True, "append": True}, "force and append contradict each other"),
    ({"steps": ()}, "steps: give at least one step index"),
    ({"steps": [2**70]}, "steps must be 0-based step indices (0 to 2⁶³ − 1)"),
    ({"steps": torch.tensor(3)}, "steps must be 0-based step indices (integers ≥ 0), got tensor(3)"),
    ({"steps": BrokenSteps()}, "steps must be 0-based step indices (integers ≥ 0), got broken steps"),
])
def test_the_recorder_and_the_callbacks_refuse_a_flag_of_the_wrong_kind_before_any_folder(tmp_path, options, line):
    import torch.nn as nn

    from fusedce_profile import StepRecorder
    from fusedce_profile.recorder import callback_arguments

    with pytest.raises(UsageError, match=re.escape(line)):
        StepRecorder(nn.Linear(2, 2), tmp_path / "rec", **{"steps": (0,), **options})
    assert not (tmp_path / "rec").exists()
    steps = options.pop("steps", (0,))
    with pytest.raises(UsageError, match=re.escape(line)):
        callback_arguments(steps, tmp_path / "cb", **options)
