"""The mark a run folder keeps while its run was stopped by a signal before it finished.

``interrupted.json`` holds :class:`Interruption`: which signal stopped the run, how much of it had
finished, and the command line that continues it. A command writes it when Ctrl-C or SIGTERM
stops it (after keeping its finished work), removes it when it starts again in the folder, and
the reports read it to say, at the top, that what they show is partial.
"""
from __future__ import annotations

import dataclasses
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
    fields = [field.name for field in dataclasses.fields(Interruption)]
    if not (isinstance(raw, dict) and set(raw) == set(fields) and all(isinstance(raw[f], str) for f in fields)):
        raise ValueError(f"{path}: not an interruption mark (an object of the strings {', '.join(fields)})")
    return Interruption(**raw)


def clear_interruption(folder: str | Path) -> None:
    """Remove the mark (a run starts again in the folder), whatever file holds its name: a link is
    removed, never followed, and a pipe too; a folder in its place is refused (``ValueError`` naming
    it) before the run measures anything, whose report would refuse it after."""
    path = Path(folder) / INTERRUPTED_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:  # EISDIR on Linux, EPERM elsewhere
        if not path.is_dir() or path.is_symlink():
            raise
        raise ValueError(f"{path}: a folder where a run keeps its interruption mark; remove it, or give "
                         "another --out") from None
