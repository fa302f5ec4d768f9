"""The record that makes a folder a run's for ``--force`` and ``--resume``: an ``environment.json`` as
every command stores it first (a file of that name with other content is a project's own)."""
from __future__ import annotations

from pathlib import Path

TOOL_ENVIRONMENT = ('{"date": "2026-12-06T12:00:00+00:00", "python": "3.11.7", "platform": "Linux", '
                    '"torch": "2.13.0+cpu", "gpu": null, "gpu_count": 0}\n')
"""The keys every stored environment holds (``environment.STORED_ENVIRONMENT_KEYS``), and two more."""


def plant_environment(folder: Path) -> Path:
    """``folder/environment.json`` as a run stores it; returns its path."""
    path = Path(folder) / "environment.json"
    path.write_text(TOOL_ENVIRONMENT)
    return path
