"""The README's promises that code can check: exit codes, install notes, the doctor's model."""
from __future__ import annotations

import json
import re

import torch

from fusedce_profile import exit_codes
from fusedce_profile.defaults import CELL_TIMEOUT_S
from pages import (DOCS, commands, fenced_blocks, logical_lines, parse_command,
                   relative_links, section)
from processes import REPO
from fusedce_profiler.instrument.models.configs import get_preset
from fusedce_profiler.judgements.doctor.doctor import CPU_MAX_PARAMETERS, make_batch

README = " ".join((REPO / "README.md").read_text().split())


def test_every_exit_code_is_in_the_readme_with_its_meaning():
    codes = {exit_codes.OK: "ok", exit_codes.CHECK_FAILED: "a check failed", exit_codes.BAD_INPUT: "bad usage", exit_codes.RUN_FAILED: "the run could not go on",
             exit_codes.INTERRUPTED: "interrupted by Ctrl-C", exit_codes.TERMINATED: "by SIGTERM"}
    line = README.split("Exit codes:")[1].split("Progress bars")[0]
    for code, meaning in codes.items():
        assert re.search(rf"\b{code} {re.escape(meaning)}", line), (code, meaning)


def test_the_readme_says_how_to_install_on_a_machine_without_a_gpu():
    assert "install the CPU build of torch first" in README
    assert '`pip install ".[triton]"` adds it' in README and "Triton is not a dependency" in README


def test_the_readme_states_the_default_cell_timeouts():
    cuda, cpu = (f"{CELL_TIMEOUT_S[kind]:g}" for kind in ("cuda", "cpu"))
    assert f"`--cell-timeout SECONDS`, by default {cuda} on CUDA and {cpu} on the CPU; 0 for none" in README


def test_the_batch_and_size_guard_the_readme_gives_for_doctor_are_the_ones_it_uses():
    batch = make_batch(512)
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
    assert (batch["labels"] == -100).any() and "-100 at padding" in README
    assert f"models above {CPU_MAX_PARAMETERS / 1e6:.0f} M parameters are refused in one line" in README


# --- the README as a newcomer reads it: short, every command real, every figure from its file ---

README_TEXT = (REPO / "README.md").read_text()


def test_the_readme_fits_in_250_lines_and_answers_the_question_in_30():
    assert len(README_TEXT.splitlines()) <= 250
    assert len(section(README_TEXT, "Why did my memory barely drop?").strip().splitlines()) <= 30


def test_every_readme_command_parses_and_every_link_exists():
    argvs = commands(README_TEXT)
    assert [] in argvs and any(a[:1] == ["grid"] for a in argvs) and any(a[:1] == ["model"] for a in argvs)
    for argv in argvs:
        parse_command(argv)
    for written, target in relative_links(REPO / "README.md"):
        assert target.exists(), written


def test_ci_runs_the_readmes_test_command_word_for_word_and_the_newcomer_test():
    install = logical_lines(fenced_blocks(README_TEXT, "bash")[0])
    test_line = next(line for line in install if "pytest" in line)
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == test_line
    assert "FUSEDCE_NEWCOMER=1" in ci
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in install
    assert "pip install . && fusedce-profile" in install


def _cells(folder: str) -> dict:
    rows = [json.loads(line) for line in (REPO / folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return {(r["spec"]["backend"], r["spec"]["tokens"]): r for r in rows}


def test_the_cpu_figures_of_the_readme_are_those_of_the_committed_cpu_run():
    cells = _cells("examples/default-report-cpu")
    mib = lambda backend, tokens: cells[(backend, tokens)]["peak_step_bytes"] / (1 << 20)  # noqa: E731
    assert (round(mib("fusedce", 512)), round(mib("torch", 512))) == (281, 240)
    assert "(281 vs 240 MiB)" in README
    saving = 1 - mib("fusedce", 2048) / mib("torch", 2048)
    assert f"{saving:.0%} less at 2048" in README
    log = (REPO / "examples/default-report-cpu/run.log").read_text()
    assert "real\t0m34.6" in log and "user\t0m33.9" in log and "sys\t0m4.6" in log
    assert "took 35 s (34 s user + 5 s system CPU time" in README
    suite = (REPO / "benchmarks/results/ci-cpu-2026-12-06b/run.txt").read_text()
    assert "2258 passed, 131 skipped" in suite and "(0:14:01)" in suite and "rc 0" in suite
    assert "real\t14m54" in suite
    assert "14 min 1 s (2,258 passed, 131 skipped" in " ".join(README.split())
    assert "the whole run 14 min 55 s" in " ".join(README.split())


def test_the_h200_figures_of_the_readme_are_in_the_reports_it_links():
    default = " ".join((REPO / "examples/default-report/summary.md").read_text().split())
    for figure in ("fusedce saves 19.7 GiB (98%) of the loss's peak: torch 20.1 GiB → fusedce 371 MiB, 1.93× the floor "
                   "of 192 MiB", "by about 317 MiB per 1k tokens", "165 MiB at 1k tokens, 19.7 GiB at 64k",
                   "torch-compile 24.7 ms, fusedce 41.6 ms (1.69×)", "cce 241 MiB", "torch-compile 4.20 GiB",
                   "cce 71.5 ms"):
        assert figure in default, figure
    timed = REPO / "benchmarks/results/default-run-h200-2026-12-04b"
    assert "Elapsed (wall clock) time (h:mm:ss or m:ss): 1:22.51" in (timed / "run2/time.txt").read_text()  # warm
    assert "Elapsed (wall clock) time (h:mm:ss or m:ss): 1:46.92" in (timed / "run1/time.txt").read_text()  # fresh
    assert ("(82 s on an H200 with warm caches, 107 s on a fresh machine, "
            "`benchmarks/results/default-run-h200-2026-12-04b/`)") in " ".join(README.split())
    recorded = (REPO / "examples/recorded/lightning-bf16-mixed-h200/summary.md").read_text()
    model = (REPO / "examples/model/user-gpt-sdpa-b32-h200/summary.md").read_text()
    explained = " ".join((REPO / "examples/explain/user-gpt-22785-22155/summary.md").read_text().split())
    for figure in ("23.9 GiB", "12.6 GiB", "28.1 GiB", "14.1 GiB", "18.1 GiB"):
        assert figure in recorded, figure
    for figure in ("23.9 GiB", "12.3 GiB"):
        assert figure in model, figure
    for figure in ("Not decided", "32 configurations fit", "would save ≥ 6.99 GiB, against 0.62 GiB seen",
                   "a 512–2,689 MiB tensor", "naive 23,621 MiB (836 MiB off)", "saving -172 MiB (-802 MiB off)",
                   "0–310 KiB of activations per token more", "3.37", "0.05–"):
        assert figure in explained, figure
    stored = json.loads((REPO / "examples/explain/user-gpt-22785-22155/explain.json").read_text())
    consistent = [h for h in stored["hypotheses"] if h["consistent"]]
    naive = [sum(h["tolerance_naive"].values()) / 2 ** 30 for h in consistent]
    saving = [sum(h["tolerance_saving"].values()) / 2 ** 30 for h in consistent]
    assert len(consistent) == 32 and "(32 of 48)" in README
    assert f"±{min(naive):.1f}–{max(naive):.1f} GiB on the naive reading" in README
    assert f"±{min(saving):.1f}–{max(saving):.1f} GiB on the" in README
    blind = (REPO / "benchmarks/results/explain-blind-h200-2026-12-04b/README.md").read_text()
    assert "Truth consistent: **12 of 12**" in blind and "12 of 12 blind H200 cases" in README
    for figure in ("≥ 6.99 GiB", "0.62 GiB seen", "within 836 MiB of the naive reading", "saves −172 MiB against 630",
                   "310 KiB"):
        assert figure in README, figure


def test_the_readmes_model_command_is_the_one_docs_model_md_runs_less_a_back_end():
    readme = next(a for a in commands(README_TEXT) if a[:1] == ["model"])
    page = commands((DOCS / "model.md").read_text())[0]  # run, and its report read, by tests/test_docs.py
    assert readme == page[:len(readme)] and page[len(readme):] == ["--backend", page[-1]]
