"""cli/usage.py: a ValueError in a validating step becomes one error line and exit code 2."""
import pytest
import typer

from fusedce_profile import exit_codes
from fusedce_cli.usage import fail, usage_errors


def test_a_value_error_inside_becomes_exit_2_with_its_message(capsys):
    with pytest.raises(typer.Exit) as caught:
        with usage_errors():
            raise ValueError("--fit must be positive")
    assert caught.value.exit_code == exit_codes.BAD_INPUT
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "--fit must be positive" in capsys.readouterr().err


def test_other_exceptions_and_exits_pass_through_unchanged():
    with pytest.raises(RuntimeError, match="boom"):
        with usage_errors():
            raise RuntimeError("boom")
    with pytest.raises(typer.Exit) as caught:
        with usage_errors():
            raise typer.Exit(exit_codes.PARITY_FAILED)
    assert caught.value.exit_code == exit_codes.PARITY_FAILED


def test_fail_prints_the_message_and_returns_the_bad_input_exit(capsys):
    exit_ = fail("--preset and --config both name a model")
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == exit_codes.BAD_INPUT
    assert "--preset and --config" in capsys.readouterr().err
