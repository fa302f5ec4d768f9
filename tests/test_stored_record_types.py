"""Every field of every stored record is checked against its type on read, all the way down.

Each record kind is taken as the tool wrote it (the example folders, and a CPU doctor run in
``fixtures/cpu_doctor``); every field of it, nested ones included (the first two items of a
list), is replaced by a value of a wrong type, and the kind's one reader must refuse it: a
whole-file record (``parity.json``, ``doctor.json``, ``explain.json``, ``fit.json``) in one line
naming the file and the field, a row of a JSON-lines file by skipping it with its line number and
the field. One command-line run per kind of failure checks the exit code and the one line.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from fusedce_profiler.grid.runner import load_results
from fusedce_profiler.instrument import store
from fusedce_profiler.instrument.recording.records import load_recorded_steps
from fusedce_profiler.instrument.step.jobs import load_model_results
from fusedce_profiler.judgements.explain.records import load_explanation
from fusedce_profiler.judgements.fit import load_fits
from fusedce_profiler.judgements.parity import load_parity_report
from fusedce_reports.doctor_report import read_doctor
from processes import cli_env, run_cli

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DOCTOR = REPO / "tests" / "fixtures" / "cpu_doctor"

#: (folder the tool wrote, file, its reader). A JSON-lines reader returns a ``Loaded``.
RECORDS: list[tuple[Path, str, Callable[[Path], Any]]] = [
    (EXAMPLES / "default-report-cpu", store.RESULTS_FILE, load_results),
    (EXAMPLES / "model" / "model-fit", store.MODEL_RESULTS_FILE, load_model_results),
    (EXAMPLES / "model" / "model-fit", store.FIT_FILE, load_fits),
    (EXAMPLES / "model" / "parity-cpu-tiny-fp32", store.PARITY_FILE, load_parity_report),
    (DOCTOR, store.DOCTOR_FILE, read_doctor),
    (EXAMPLES / "explain" / "user-gpt-22785-22155", store.EXPLAIN_FILE, load_explanation),
    (EXAMPLES / "recorded" / "lightning-bf16-mixed-h200", store.RECORDED_STEPS_FILE, load_recorded_steps),
]
#: Fields stored as free-form objects (what the tool adds about a run, a model's source): held as
#: stored, shown as text, never computed with.
FREE_FORM = {"extra", "source", "options"}


def _fields(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) below ``value``: object keys, and the first two items of each list."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value[:2]))
    else:
        return
    for key, item in items:
        if key in FREE_FORM:
            continue
        yield (*path, key), item
        yield from _fields(item, (*path, key))


def _wrong_types(value: Any) -> list[Any]:
    """Values of a type ``value`` is not: an object for a list, a list for an object, …"""
    if isinstance(value, bool):
        return ["yes", 1]
    if isinstance(value, (int, float)):
        return ["12", [1]]
    if isinstance(value, str):
        return [1.5, {"a": 1}]
    if isinstance(value, list):
        return [{"a": 1}]
    return [[1]]  # an object, or null where an object may stand


def _replaced(record: Any, path: tuple, new: Any) -> Any:
    """``record`` with the value at ``path`` replaced by ``new``; ``record`` is left as it was.

    Only the objects and lists along ``path`` are copied (what is beside it is shared, never
    changed): a deep copy of a whole record for each of over a thousand mutations was most of
    this module's time."""
    if not path:
        return new
    head, *rest = path
    changed = copy.copy(record)
    changed[head] = _replaced(record[head], tuple(rest), new)
    return changed


def _mutations() -> Iterator[tuple[Path, str, Callable, tuple, Any, str]]:
    for folder, name, reader in RECORDS:
        text = (folder / name).read_text()
        if name.endswith(".jsonl"):
            first, *rest = text.splitlines()
            record = json.loads(first)
        else:
            record, rest = json.loads(text), None
        for path, value in _fields(record):
            for new in _wrong_types(value):
                mutated = _replaced(record, path, new)
                stored = (json.dumps(mutated) + "\n" + "".join(f"{line}\n" for line in rest) if rest is not None
                          else json.dumps(mutated))
                yield folder, name, reader, path, new, stored


def test_a_field_of_a_wrong_type_anywhere_in_a_record_is_refused_naming_it(tmp_path):
    failures, tried = [], 0
    for folder, name, reader, path, new, stored in _mutations():
        tried += 1
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / name).write_text(stored)
        field = next((key for key in reversed(path) if isinstance(key, str)), f"[{path[-1]}]")
        where = f"{name} {'.'.join(map(str, path))} = {new!r}"
        try:
            read = reader(run)
        except ValueError as exc:
            message = str(exc)
            if "\n" in message or name not in message or field not in message:
                failures.append(f"{where}: refused, but not in one line naming the file and {field!r}: {message}")
            continue
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            failures.append(f"{where}: {type(exc).__name__}: {exc}")
            continue
        if isinstance(read, store.Loaded):
            problems = [p for p in read.skipped if p.line == 1]
            if not problems:
                failures.append(f"{where}: the row was read")
            elif field not in problems[0].reason:
                failures.append(f"{where}: the row was skipped without naming {field!r}: {problems[0].reason}")
        else:
            failures.append(f"{where}: read")
    assert tried > 1000  # every kind, every nested field
    assert not failures, f"{len(failures)} of {tried}:\n" + "\n".join(failures[:40])


@pytest.mark.parametrize("example, name, path, new", [
    (EXAMPLES / "model" / "parity-cpu-tiny-fp32", store.PARITY_FILE, ("verdicts", 0, "passed"), "x"),
    (EXAMPLES / "recorded" / "lightning-bf16-mixed-h200", store.RECORDED_STEPS_FILE,
     ("attribution", "large_tensors", 0, "bytes"), [1]),
])
def test_report_of_a_record_of_a_wrong_type_is_one_line(example, name, path, new, tmp_path):
    """A whole-file record: exit 2 in one line; a row: the report is written and names the row."""
    run = tmp_path / "run"
    shutil.copytree(example, run)
    lines = (run / name).read_text().splitlines() if name.endswith(".jsonl") else [(run / name).read_text()]
    lines[0] = json.dumps(_replaced(json.loads(lines[0]), path, new))
    (run / name).write_text("\n".join(lines) + "\n")
    result = run_cli(["report", str(run)], cli_env())
    assert "Traceback" not in result.stderr + result.stdout
    if name.endswith(".jsonl"):
        assert result.returncode == 0, result.stderr
        assert f"{name}:1: not a valid row" in result.stdout
    else:
        assert result.returncode == 2, result.stdout
        (line,) = result.stderr.strip().splitlines()
        assert str(run / name) in line and "verdicts[0].passed must be true or false" in line


@pytest.mark.parametrize("example, name, path, new, message", [
    (EXAMPLES / "model" / "parity-cpu-tiny-fp32", store.PARITY_FILE, ("entropy_rate",), "NaN",
     "entropy_rate must be a finite number ≥ 0, got nan"),
    (EXAMPLES / "recorded" / "lightning-bf16-mixed-h200", store.RECORDED_STEPS_FILE, ("step",), -1,
     "step must be at least 0, got -1"),
])
def test_a_value_the_writer_never_stores_is_refused_naming_it(example, name, path, new, message, tmp_path):
    """``entropy_rate: NaN`` was shown as "nan nats"; ``step: -1`` as "step -1" in the findings."""
    from fusedce_profiler.instrument.recording.records import load_recorded_steps
    from fusedce_profiler.judgements.parity import load_parity_report

    run = tmp_path / "run"
    shutil.copytree(example, run)
    lines = (run / name).read_text().splitlines() if name.endswith(".jsonl") else [(run / name).read_text()]
    lines[0] = json.dumps(_replaced(json.loads(lines[0]), path, new))
    (run / name).write_text("\n".join(lines) + "\n")
    if name == store.PARITY_FILE:
        with pytest.raises(ValueError, match=message):
            load_parity_report(run)
    else:
        assert message in load_recorded_steps(run).skipped[0].reason


def test_a_module_name_python_imports_is_a_back_end_name_and_a_formula_never_is():
    """``café:loss`` passed the back-end check, then every cell's row was refused as "not a valid row"."""
    from fusedce_profiler.instrument.records import is_backend_name

    assert all(map(is_backend_name, ["torch", "fusedce-min", "café:loss", "pkg.mod:make_loss", "x.y:z.w"]))
    assert not any(map(is_backend_name, ["=x:y", "+1", "a:b:c", "a:", "torch\n=1", "m:\u200b", "@SUM(A1)"]))
