"""What a command did, as the command line needs it beside the records the Python function returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommandOutcome:
    """``records``: the typed records the command stored (what its Python function returns);
    ``exit_code``: what ``fusedce-profile`` exits with (:mod:`fusedce_profile.exit_codes`);
    ``summary``: the ``--json`` summary; ``stopped``: the ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM
    as :class:`~fusedce_profile.signals.Terminated`) that ended the command early, after its
    finished work was kept and a partial report written (``None``: it ran to its end)."""

    records: list
    exit_code: int
    summary: dict[str, Any] = field(default_factory=dict)
    stopped: KeyboardInterrupt | None = None
    failure: str | None = None
    """Why the run could not go on (exit 3: a worker could not start), in one line; ``None`` otherwise."""

    def records_or_raise(self) -> list:
        """The records, or the stopping interrupt raised again (a Python caller sees Ctrl-C as Ctrl-C),
        or :class:`~fusedce_profile.errors.RunStopped` where the run could not go on."""
        if self.stopped is not None:
            raise self.stopped
        if self.failure is not None:
            from fusedce_profile.errors import RunStopped

            raise RunStopped(self.failure, self.records)
        return self.records
