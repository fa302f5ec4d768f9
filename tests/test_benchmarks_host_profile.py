"""benchmarks/host_profile.py's arguments on the CPU: a case is N×H×V:MODE:BUDGET, anything else one line, exit 2."""
import pytest

from benchmarks import host_profile


def test_a_case_is_read_as_head_mode_and_budget():
    assert host_profile.case_of("8192x768x32777:bf16:fast") == ("8192x768x32777", "bf16", "fast")


@pytest.mark.parametrize("text", ["foo", "8192x768:bf16:fast", "8192x768x0:bf16:fast", "8192x768x32777:fp8:fast",
                                  "8192x768x32777:amp:quick", "8192x768x32777:amp"])
def test_a_malformed_case_is_one_line_naming_the_option_and_exit_2(monkeypatch, capsys, text):
    monkeypatch.setattr("sys.argv", ["host_profile.py", "--out", "x.json", "--cases", text])
    with pytest.raises(SystemExit) as exited:
        host_profile.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and err[-1].startswith("host_profile.py: error: argument --cases: expected")
