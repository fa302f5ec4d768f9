"""Figures without global state: every plot is drawn on matplotlib's Agg canvas directly.

No ``pyplot``, no ``matplotlib.use``: importing the reports never changes the backend of the
program around them (a user's Lightning job, a notebook). :func:`save_figure` renders to
memory and writes the PNG atomically, so a failed write never leaves a broken image.
"""
from __future__ import annotations

import io
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

