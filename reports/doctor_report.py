"""The doctor run's report: ``summary.md`` from the folder's ``doctor.json``.

A pure function of the stored :class:`fusedce_profiler.judgements.doctor.doctor.DoctorRun` (and of
``environment.json`` when the folder has one): :func:`write_doctor_report` is what
``fusedce-profile doctor --out DIR`` calls after writing ``doctor.json``, and what
``fusedce-profile report DIR`` calls to rebuild it.
"""
from __future__ import annotations

import math

from pathlib import Path

import pandas as pd

from fusedce_profiler.instrument import store
from fusedce_profiler.judgements.doctor.precision import SAFETY
from fusedce_profiler.judgements.doctor.records import DoctorRun
from fusedce_reports.environment import environment_lines, read_environment
from fusedce_reports.escape import code_block, markdown_text
from fusedce_reports.listing import and_more, listed
from fusedce_reports.markdown import markdown_table

VERDICT_MEANING = (
    "pass: the wrapper behaves as the model's own loss on this item; fail: it does not (the evidence "
    "says how); unclear: the evidence does not decide; not checked: the item depends on one that "
    "failed (named in its evidence); n/a: the model has nothing to check there."
)


def spread_sentence(spread: dict) -> str:
    """What the run's precision policy does to the model's own loss, and the tolerances it gives."""
    if spread.get("mode") == "fp32":
        return f"fp32, the fp32 floor {spread.get('tolerance', 0):.1e} for the loss and every gradient"
    all_groups = list((spread.get("groups") or {}).items())
    shown, _ = listed(all_groups, "groups", store.DOCTOR_FILE)
    groups = ", ".join(f"{k} {v:.1e}" for k, v in shown) + and_more(all_groups, shown, "groups")
    return (f"{spread.get('mode')} against fp32 on the model's own loss over {spread.get('samples')} batches moves "
            f"the loss by {spread.get('loss', 0):.1e} and the gradients by {groups or '–'}; each tolerance is "
            f"{SAFETY:g} × that spread, at least {spread.get('floor', 0):.0e}")


def read_doctor(folder: Path) -> DoctorRun:
    """The folder's ``doctor.json``; ``ValueError`` naming the file and the bad field."""
    path = Path(folder) / store.DOCTOR_FILE
    try:
        return DoctorRun.from_dict(store.read_json(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def doctor_table(run: DoctorRun) -> pd.DataFrame:
    """One row per item, of the first :data:`~fusedce_reports.listing.MAX_LISTED`: item, verdict, evidence."""
    checks, _ = listed(run.checks, "checks", store.DOCTOR_FILE)
    return pd.DataFrame([{"item": c.item, "verdict": c.verdict, "evidence": c.evidence} for c in checks],
                        columns=["item", "verdict", "evidence"])


def _loss_text(value) -> str:
    """A stored loss: a number (a non-finite one named as JSON stores it: ``NaN``, ``Infinity``), or None."""
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return f"{value:.6g}" if isinstance(value, (int, float)) else str(value)


def render_doctor_markdown(run: DoctorRun, environment: dict) -> str:
    """The whole ``summary.md`` of a doctor folder."""
    failed = [c.item for c in run.checks if c.verdict == "fail"]
    title = "INTERRUPTED" if run.interrupted else ("PASS" if run.passed else "FAIL")
    lines = [f"# fusedce-profile doctor: {title}", ""]
    if run.interrupted:
        lines += ["The run was interrupted before the checks finished: no verdict. Run the same command with `--force` (it replaces this folder).", ""]
    wrapper = markdown_text(run.loss) if run.loss else "a loss wrapper (not recorded)"
    model = f" on the {markdown_text(run.config)} model" if run.config else ""
    where = f"{'GPU' if run.device.startswith('cuda') else 'CPU'}, {markdown_text(run.mode, line_start=False)}"
    size = f", {run.parameters / 1e6:.1f} M parameters" if run.parameters else ""
    batch = f", a padded batch of {run.batch}×{run.seq} tokens" if run.batch else ""
    lines += [f"Loss wrapper {wrapper}, checked{model} ({where}{size}{batch}) against the model's own forward "
              f"and cross-entropy: {len(run.checks)} items, {len(failed)} failed.", ""]
    if failed:
        named, _ = listed(failed, "failed items", store.DOCTOR_FILE)
        lines += [f"**Failed:** {markdown_text('; '.join(named), line_start=False)}{and_more(failed, named)}.", ""]
    lines += [markdown_table(doctor_table(run)), ""] + listed(run.checks, "checks", store.DOCTOR_FILE)[1]
    lines += [VERDICT_MEANING, ""]
    if run.spread:
        lines += [f"Tolerances: {markdown_text(spread_sentence(run.spread), line_start=False)}.", ""]
    if run.head:
        bias = "a bias" if run.head.get("bias") else "no bias"
        tie = "tied to the input embedding" if run.head.get("tied") else "untied"
        lines += [f"The LM head: {markdown_text(str(run.head.get('path', '?')), line_start=False)} "
                  f"(V={run.head.get('vocab')}, H={run.head.get('hidden')}, {bias}, {tie}).", ""]
    if run.losses:
        losses, left_out = listed(list(run.losses.items()), "loss values", store.DOCTOR_FILE)
        table = pd.DataFrame([{"loss": name, "value": _loss_text(value)}
                              for name, value in losses], columns=["loss", "value"])
        lines += ["Loss values on the doctor's batch: yours, the model's own (the reference), and the "
                  "reference with each known mistake, to compare yours with:", "", markdown_table(table), ""]
        lines += left_out
    if environment:
        lines += ["<details><summary>Environment</summary>", ""] + code_block(environment_lines(environment))
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def write_doctor_report(folder: Path) -> Path:
    """Render ``summary.md`` from the folder's ``doctor.json``; returns its path."""
    folder = Path(folder)
    text = render_doctor_markdown(read_doctor(folder), read_environment(folder))
    return store.write_text(folder / "summary.md", text)
