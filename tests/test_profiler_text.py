"""profiler/text.py: a terminal one-liner is shortened at a word boundary, never mid-word."""
import json
import shutil
from pathlib import Path

import pytest

from fusedce_profiler.instrument.text import capped, count, shorten


def test_a_short_first_line_is_kept_whole_and_dropped_lines_are_marked():
    assert shorten("RuntimeError: boom") == "RuntimeError: boom"
    assert shorten("\n  first line\nsecond line") == "first line …"


def test_a_long_line_is_cut_at_the_last_space_with_an_ellipsis():
    text = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.1 GiB"
    cut = shorten(text, 40)
    assert cut == "CUDA out of memory. Tried to allocate…"
    assert len(cut) <= 40 and text.startswith(cut[:-1])


def test_one_word_longer_than_the_width_is_not_cut_inside():
    path = "/very/long/path/" + "x" * 100 + "/worker.log"
    assert shorten(path, 40) == path
    assert shorten(f"{path} and more", 40) == f"{path}…"


def test_counts_agree_with_their_noun():
    assert [count(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]


def test_capped_cuts_every_line_past_the_limit_and_counts_what_it_left_out():
    assert capped("short\nlines", 5) == "short\nlines"
    assert capped("abcdefgh\nok\n" + "y" * 12, 5) == ("abcde… (3 more characters in the stored record)\nok\n"
                                                      "yyyyy… (7 more characters in the stored record)")


@pytest.mark.parametrize("folder", ["runs/plain", "d $(touch PWNED) x", "it's; rm -rf ~", "a`b`"])
def test_a_folder_named_in_a_continue_line_is_one_shell_word_that_names_it(folder):
    """"continue with the same command and --resume --out DIR" named the folder as it was: pasted, a
    folder called ``d $(touch PWNED) x`` ran the command substitution and resumed ``d``."""
    import shlex

    from fusedce_profiler.instrument.text import same_command_resumed, shell_word

    assert shlex.split(f"fusedce-profile grid --resume --out {shell_word(folder)}")[-1] == folder
    hint = same_command_resumed(folder)
    assert hint.startswith("the same command and --resume --out ")
    assert shlex.split(hint.removeprefix("the same command and "))[-2:] == ["--out", folder]


@pytest.mark.parametrize("folder", ["-g", "--out", "a\nb", "b\x1b[31mred", "\u202eevil", "x\udcffy", "it's",
                                    "a\\b'c", "tab\there", "c1\u0085", "plain é", "\x01\x02",
                                    "\U000e0041tag", "bidi\u202ecod", "=g", "=ls"])
def test_a_folder_in_a_hint_pasted_into_bash_names_that_folder(folder):
    """A name starting with ``-`` was pasted as an option of ``report``; a name holding a newline or an
    escape was shown spelled out (``a\\nb``), which pasted names another folder."""
    import os
    import shutil
    import subprocess

    from fusedce_profiler.instrument.text import printable, shell_word

    word = shell_word(folder)
    assert printable(word) == word and "\n" not in word and "\t" not in word and not word.startswith("-")
    if shutil.which("bash") is None:
        pytest.skip("no bash to paste into")
    shells = ["bash"] + (["zsh"] if shutil.which("zsh") else [])  # zsh: =name is a command's path
    for shell in shells:
        for locale in ("C.UTF-8", "C", "POSIX"):  # bash reads \\u escapes through the locale: bytes it reads alike
            pasted = subprocess.run([shell, "-c", f"printf %s {word}"], capture_output=True, check=True,
                                    env={**os.environ, "LC_ALL": locale}).stdout
            assert os.path.normpath(os.fsdecode(pasted)) == os.path.normpath(folder), (shell, locale)


def test_the_report_of_a_cut_grid_names_its_folder_as_one_shell_word(tmp_path):
    from fusedce_reports.build import build_report

    folder = tmp_path / "d $(touch PWNED) x"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "default-report-cpu", folder)
    plan = json.loads((folder / "plan.json").read_text())
    extra = {**plan["cells"][0], "tokens": plan["cells"][0]["tokens"] + 1}
    (folder / "plan.json").write_text(json.dumps({"cells": plan["cells"] + [extra]}))
    report = build_report(folder)
    assert any(f"--resume --out '{folder}'" in note for note in report.notes), report.notes
