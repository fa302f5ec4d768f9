"""Every numeric option of every command is range-checked before anything runs: a size past what a
tensor can be, a NaN, an infinite time limit or a seed past 64 bits is one line naming the option
and its range, exit 2, and no folder — on the command line and in the Python functions alike."""
from __future__ import annotations

import typing

import pytest
import typer
from typer.testing import CliRunner

from fusedce_cli.app import app
from fusedce_profile.errors import UsageError
from fusedce_profile.ranges import RANGES, check_ranges, option_range

pytestmark = pytest.mark.faults  # the fault suite: pytest -m faults

HUGE = "99999999999999999999"  # 20 digits: past 64 bits
EXPLAIN = ["explain", "--device", "cpu", "--preset", "tiny", "--naive", "3", "--fused", "2", "--card", "24"]
DOCTOR = ["doctor", "--loss", "pkg.losses:loss", "--device", "cpu"]
TEXT_OPTIONS = {"--tokens", "--batch", "--seq", "--vocab", "--hidden", "--seq-candidates", "--calibration-batches",
                "--ignore-frac", "--label-smoothing", "--z-loss", "--softcap"}
"""Options typed as text on the command line (``4k``, ``1024,2048``, ``none,30``) that carry numbers."""

CASES = [
    (["grid", "--device", "cpu", "--tokens", HUGE], "--tokens"),
    (["grid", "--device", "cpu", "--batch", HUGE, "--seq", "8"], "--batch"),
    (["grid", "--device", "cpu", "--batch", "2", "--seq", HUGE], "--seq"),
    (["grid", "--device", "cpu", "--vocab", HUGE], "--vocab"),
    (["grid", "--device", "cpu", "--hidden", "3000000000"], "--hidden"),
    (["grid", "--device", "cpu", "--ignore-frac", "nan"], "--ignore-frac"),
    (["grid", "--device", "cpu", "--label-smoothing", "1"], "--label-smoothing"),
    (["grid", "--device", "cpu", "--z-loss", "inf"], "--z-loss"),
    (["grid", "--device", "cpu", "--softcap", "none,inf"], "--softcap"),
    (["grid", "--device", "cpu", "--repeats", HUGE], "--repeats"),
    (["grid", "--device", "cpu", "--warmup", "-1"], "--warmup"),
    (["grid", "--device", "cpu", "--cell-timeout", "inf"], "--cell-timeout"),
    (["--device", "cpu", "--cell-timeout", "nan"], "--cell-timeout"),
    (["model", "--device", "cpu", "--batch", HUGE], "--batch"),
    (["model", "--device", "cpu", "--seq", "0"], "--seq"),
    (["model", "--device", "cpu", "--fit", "inf"], "--fit"),
    (["model", "--device", "cpu", "--fit", "12000"], "--fit"),  # MiB typed for GiB
    (["model", "--device", "cpu", "--fit-max", HUGE], "--fit-max"),
    (["model", "--device", "cpu", "--seed", HUGE], "--seed"),
    (["model", "--device", "cpu", "--factory-timeout", "inf"], "--factory-timeout"),
    (["parity", "--device", "cpu", "--steps", HUGE], "--steps"),
    (["parity", "--device", "cpu", "--batch", HUGE], "--batch"),
    (["parity", "--device", "cpu", "--seq", "1"], "--seq"),
    (["parity", "--device", "cpu", "--lr", "nan"], "--lr"),
    (["parity", "--device", "cpu", "--ignore-frac", "inf"], "--ignore-frac"),
    (["parity", "--device", "cpu", "--loss-tol", "-inf"], "--loss-tol"),
    (["parity", "--device", "cpu", "--loss-tol", "1e9"], "--loss-tol"),  # passes any two finite losses
    (["parity", "--device", "cpu", "--seed", "-1"], "--seed"),
    ([*DOCTOR, "--batch", HUGE], "--batch"),
    ([*DOCTOR, "--seq", "4"], "--seq"),
    ([*DOCTOR, "--seed", HUGE], "--seed"),
    ([*DOCTOR, "--timeout", "inf"], "--timeout"),
    ([*DOCTOR, "--memory-limit", "inf"], "--memory-limit"),
    ([*DOCTOR, "--memory-limit", "0"], "--memory-limit"),
    ([*DOCTOR, "--memory-limit", "4096"], "--memory-limit"),  # MiB typed for GiB
    ([*EXPLAIN, "--naive", "nan"], "--naive"),
    ([*EXPLAIN, "--fused", "inf"], "--fused"),
    ([*EXPLAIN, "--card", "nan"], "--card"),
    ([*EXPLAIN, "--batch", HUGE], "--batch"),
    ([*EXPLAIN, "--seq", HUGE], "--seq"),
    ([*EXPLAIN, "--seq-candidates", f"512,{HUGE}"], "--seq-candidates"),
    ([*EXPLAIN, "--calibration-batches", f"2,{HUGE}"], "--calibration-batches"),
    ([*EXPLAIN, "--confirm", HUGE], "--confirm"),
    ([*EXPLAIN, "--context-mib", "nan"], "--context-mib"),
]


@pytest.mark.parametrize("argv, option", CASES, ids=[" ".join(argv[:1] + argv[-2:]) for argv, _ in CASES])
def test_a_value_out_of_range_is_one_line_naming_the_option_and_exit_2(argv, option, tmp_path):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, [*argv, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} ") and ": expected " in lines[0], result.output
    command = argv[0] if not argv[0].startswith("--") else "grid"
    assert option_range(option, command).describe() in lines[0]
    assert not out.exists()


def _numeric_options(command) -> set[str]:
    """The options of ``command`` (a typer command) that take an int or a float, or integers as text."""
    found = set()
    for param in command.params:
        annotation = param.type_descriptor.annotation
        if {int, float} & {annotation, *typing.get_args(annotation)} or param.opts[0] in TEXT_OPTIONS:
            found.add(param.opts[0])
    return found


def test_every_numeric_option_of_every_command_has_a_range():
    group = typer.main.get_command(app)
    commands = {"(default)": group, **group.commands}
    options = {name: _numeric_options(command) for name, command in commands.items()}
    assert {"--tokens", "--repeats", "--cell-timeout"} <= options["grid"]  # the census sees them
    missing = {name: sorted(found - RANGES.keys()) for name, found in options.items() if found - RANGES.keys()}
    assert not missing, f"numeric options with no range in fusedce_profile.ranges.RANGES: {missing}"


@pytest.mark.parametrize("call, option", [
    (lambda api, out: api.run_grid(tokens=[8, 10**20], device="cpu", out=out), "--tokens"),
    (lambda api, out: api.run_grid(tokens=[8], repeats=True, device="cpu", out=out), "--repeats"),
    (lambda api, out: __import__("fusedce_profile.grid").grid.run_default(device="cpu", cell_timeout=float("inf"),
                                                                         out=out), "--cell-timeout"),
    (lambda api, out: api.profile_model(preset="tiny", seed=2**64, device="cpu", out=out), "--seed"),
    (lambda api, out: api.parity(preset="tiny", lr=float("nan"), device="cpu", out=out), "--lr"),
    (lambda api, out: api.doctor("pkg.losses:loss", memory_limit_gb=float("inf"), device="cpu", out=out),
     "--memory-limit"),
    (lambda api, out: api.explain(naive=3, fused=2, card=24, preset="tiny", seq=2**40, device="cpu", out=out),
     "--seq"),
], ids=["run_grid tokens", "run_grid repeats", "run_default cell_timeout", "profile_model seed", "parity lr",
        "doctor memory_limit_gb", "explain seq"])
def test_the_python_functions_refuse_the_same_values_before_making_a_folder(call, option, tmp_path):
    import fusedce_profile as api

    out = tmp_path / "never"
    with pytest.raises(UsageError, match=f"^{option} .*: expected "):
        call(api, out)
    assert not out.exists()


def test_a_range_holds_only_finite_numbers_of_its_kind():
    with pytest.raises(UsageError, match=r"^--seed 1\.5: expected an integer from 0 to 9223372036854775807$"):
        check_ranges("model", seed=1.5)
    with pytest.raises(UsageError, match=r"^--tokens '8': expected an integer from 1 to 2147483647$"):
        check_ranges("grid", tokens=["8"])
    with pytest.raises(UsageError, match=r"^--vocab 1{37}\.\.\.: expected an integer from 1 to 2147483647$"):
        check_ranges("grid", vocab=[int("1" * 400)])  # past what a float holds, shown cut
    check_ranges("grid", tokens=[1, 2**31 - 1], softcap=[None, 30.0], ignore_frac=0.0, cell_timeout=0)
    assert option_range("--seq", "doctor").describe() == "an integer from 8 to 2147483647"
    assert option_range("--seq", "model").describe() == "an integer from 1 to 2147483647"


@pytest.mark.parametrize("command", [["grid", "--tokens"], ["explain", *EXPLAIN[1:], "--seq-candidates"]])
def test_a_count_past_the_digits_python_converts_is_one_line_and_exit_2(command, tmp_path):
    result = CliRunner().invoke(app, [*command, "9" * 5000, "--out", str(tmp_path / "never")])
    assert result.exit_code == 2, result.output
    assert "has 5000 digits: not a count" in result.output and "Traceback" not in result.output
    assert len(result.output) < 500  # the number is not repeated whole
