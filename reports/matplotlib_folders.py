"""Matplotlib's temporary configuration folder, removed where the command line's fast exit skips it.

Light on purpose: it imports no back-end, so the command line can call it on its way out in
milliseconds (importing :mod:`fusedce_reports.figures` would load the Agg back-end there).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


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
