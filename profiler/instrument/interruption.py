"""The mark a run folder keeps while its run was stopped by a signal before it finished.

``interrupted.json`` holds :class:`Interruption`: which signal stopped the run, how much of it had
finished, and the command line that continues it. A command writes it when Ctrl-C or SIGTERM
stops it (after keeping its finished work), removes it when it starts again in the folder, and
the reports read it to say, at the top, that what they show is partial.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from fusedce_profiler.instrument import store

INTERRUPTED_FILE = "interrupted.json"


@dataclass(frozen=True)
class Interruption:
    """``signal``: ``"Ctrl-C"`` or ``"SIGTERM"``; ``finished``: what had finished (``"3 of 5 jobs"``);
    ``continue_with``: what continues the run (``"the same command with --resume --out DIR"``)."""

    signal: str
    finished: str
    continue_with: str

    def sentence(self) -> str:
        return (f"Interrupted by {self.signal} after {self.finished}: this report shows what had finished; "
                f"continue with {self.continue_with}.")


def mark_interrupted(folder: str | Path, interruption: Interruption) -> Path:
    """Store ``interruption`` in ``folder``."""
    return store.write_json(Path(folder) / INTERRUPTED_FILE, asdict(interruption))


def read_interruption(folder: str | Path) -> Interruption | None:
    """The folder's stored interruption, ``None`` when its run was not stopped; ``ValueError`` naming the
    file when the mark is damaged, and a link, pipe or folder in its place refused as every run file is
    (:mod:`fusedce_profiler.instrument.confined`): a cut run's report never reads as a finished one's."""
    path = Path(folder) / INTERRUPTED_FILE
    if not store.present(path):
        return None
    raw = store.read_json(path)
    try:
        return Interruption(str(raw["signal"]), str(raw["finished"]), str(raw["continue_with"]))
    except (KeyError, TypeError):
        raise ValueError(f"{path}: not an interruption mark (signal, finished, continue_with)") from None


def clear_interruption(folder: str | Path) -> None:
    """Remove the mark (a run starts again in the folder); a link is removed, never followed."""
    path = Path(folder) / INTERRUPTED_FILE
    if path.is_symlink() or path.is_file():
        path.unlink()
