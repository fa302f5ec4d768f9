"""Figures without global state: every plot is drawn on matplotlib's Agg canvas directly.

No ``pyplot``, no ``matplotlib.use``: importing the reports never changes the backend of the
program around them (a user's Lightning job, a notebook). :func:`save_figure` renders to
memory and writes the PNG atomically, so a failed write never leaves a broken image.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fusedce_profiler.instrument import store


def new_figure(figsize: tuple[float, float], nrows: int = 1, ncols: int = 1, **subplots) -> tuple[Figure, object]:
    """A figure on its own Agg canvas and its axes (``Figure.subplots`` arguments)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **subplots)


def save_figure(fig: Figure, path: str | Path, **savefig) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    return store.write_bytes(path, buffer.getvalue())


def discard_temporary_config(named_by_user: str | None) -> None:
    """Remove the folder matplotlib made in the temporary folder for its configuration and cache
    when neither ``MPLCONFIGDIR`` nor the home folder could be written. Matplotlib removes it at
    interpreter exit; the command line ends with ``os._exit``, which skips that. Matplotlib names
    that folder in ``MPLCONFIGDIR`` itself (for its child processes); ``named_by_user``, the
    variable's value before matplotlib was imported, is never removed."""
    import matplotlib

    for made in {matplotlib.get_configdir(), matplotlib.get_cachedir()}:
        folder = Path(made)
        if (folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("matplotlib-")
                and not (named_by_user and os.path.realpath(named_by_user) == os.path.realpath(folder))):
            shutil.rmtree(folder, ignore_errors=True)
