"""The doctor run's report: ``summary.md`` from the folder's ``doctor.json``.

A pure function of the stored :class:`profiler.training.doctor.DoctorRun` (and of
``environment.json`` when the folder has one): :func:`write_doctor_report` is what
``fusedce-profile doctor --out DIR`` calls after writing ``doctor.json``, and what
``fusedce-profile report DIR`` calls to rebuild it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from profiler import store
from profiler.training.doctor import DoctorRun
from reports.environment import environment_lines, read_environment
from reports.escape import code_block, markdown_text
from reports.markdown import markdown_table

VERDICT_MEANING = (
    "pass: the wrapper behaves as the reference on this item; fail: it does not (the evidence "
    "says how); unclear: the check could not decide."
)


def read_doctor(folder: Path) -> DoctorRun:
    """The folder's ``doctor.json``; ``ValueError`` naming the file and the bad field."""
    path = Path(folder) / store.DOCTOR_FILE
    try:
        return DoctorRun.from_dict(store.read_json(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def doctor_table(run: DoctorRun) -> pd.DataFrame:
    """One row per item: item, verdict, evidence."""
    return pd.DataFrame([{"item": c.item, "verdict": c.verdict, "evidence": c.evidence} for c in run.checks],
                        columns=["item", "verdict", "evidence"])


def render_doctor_markdown(run: DoctorRun, environment: dict) -> str:
    """The whole ``summary.md`` of a doctor folder."""
    failed = [c.item for c in run.checks if c.verdict == "fail"]
    lines = [f"# fusedce-profile doctor: {'PASS' if run.passed else 'FAIL'}", ""]
    wrapper = markdown_text(run.loss) if run.loss else "a loss wrapper (not recorded)"
    model = f" on the {markdown_text(run.config)} model" if run.config else ""
    lines += [f"Loss wrapper {wrapper}, checked{model} (CPU, fp32) against the reference cross-entropy: "
              f"{len(run.checks)} items, {len(failed)} failed.", ""]
    if failed:
        lines += [f"**Failed:** {markdown_text('; '.join(failed), line_start=False)}.", ""]
    lines += [markdown_table(doctor_table(run)), "", VERDICT_MEANING, ""]
    if environment:
        lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment))
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def write_doctor_report(folder: Path) -> Path:
    """Render ``summary.md`` from the folder's ``doctor.json``; returns its path."""
    folder = Path(folder)
    text = render_doctor_markdown(read_doctor(folder), read_environment(folder))
    return store.write_text(folder / "summary.md", text)
