"""The environment block of a report: what ran the measurement.

The profiler stores the environment of a run as ``environment.json`` in the run folder
(a JSON object; nested objects allowed; :mod:`fusedce_profiler.instrument.environment`). The report shows it flattened to ``key: value``
lines, the way PyTorch's bug template asks for ``collect_env`` output.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_SESSIONS_SHOWN = 20
"""Later sessions of a run (``resumed``) listed one by one; the rest are counted in one line."""


def read_environment(run_dir: Path) -> dict[str, Any]:
    """The stored environment of a run (:func:`fusedce_profiler.instrument.environment.load_environment`)."""
    from fusedce_profiler.instrument.environment import load_environment

    return load_environment(run_dir)


def environment_lines(environment: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: value`` lines, nested keys joined with dots, lists joined with commas; each one line
    (:func:`~fusedce_profiler.instrument.text.one_line`: a stored newline is written ``\\n``, so no
    value of a folder's ``environment.json`` adds lines to a page or ends its code block)."""
    from fusedce_profiler.instrument.text import one_line

    lines = []
    for key, value in environment.items():
        name = f"{prefix}{one_line(key)}"
        if isinstance(value, dict):
            lines.extend(environment_lines(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
            # e.g. "resumed": the environments of later sessions of the same run; show
            # only what differs from this one, so an unchanged machine costs one line each.
            for index, item in enumerate(value[:MAX_SESSIONS_SHOWN], start=1):
                changed = {k: v for k, v in item.items() if environment.get(k) != v}
                lines.extend(environment_lines(changed, prefix=f"{name}[{index}].") or [f"{name}[{index}]: same"])
            if len(value) > MAX_SESSIONS_SHOWN:
                lines.append(f"{name}[{MAX_SESSIONS_SHOWN + 1}–{len(value)}]: {len(value) - MAX_SESSIONS_SHOWN:,} more "
                             "sessions, not shown")
        elif isinstance(value, (list, tuple)):
            lines.append(f"{name}: {one_line(', '.join(str(v) for v in value))}")
        else:
            lines.append(f"{name}: {'–' if value is None else one_line(value)}")
    return lines
