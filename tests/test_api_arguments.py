"""The commands' Python functions refuse an argument of the wrong kind (a number for a name or a
path, a number for a list) as the command line does: one ``UsageError`` naming the option, before
any folder is made (:mod:`fusedce_profile.arguments`), never a ``TypeError`` from inside."""
from __future__ import annotations

import pytest

import fusedce_profile as fp
from fusedce_profile.errors import UsageError

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

CPU = {"device": "cpu"}
EXPLAIN = {"naive": 3.2, "fused": 2.9, "card": 24, **CPU}
LOSS = {"loss": "test_model_doctor:correct"}


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
])
def test_an_argument_of_the_wrong_kind_is_a_usage_error_naming_it(function, arguments, line, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default folder would land here
    with pytest.raises(UsageError) as refused:
        getattr(fp, function)(**arguments)
    assert str(refused.value) == line
    assert not any(tmp_path.iterdir())  # refused before any folder was made
