"""What a finished run folder must not carry about the machine it ran on: its paths and its name.

A worker's log holds what its child printed — tracebacks, warnings, a job's header — and those
name the Python installation, the home folder, the current folder and the run folder by their
absolute paths. A run folder is made to be attached to a bug report, so when a worker ends its
log is rewritten with each of those replaced by a placeholder (the environment block is the one
place that says what the machine was):

==========================  ===============
absolute path or name        placeholder
==========================  ===============
the run folder               ``<run folder>``
the current folder           ``<cwd>``
the Python installation      ``<python>`` (``sys.prefix``, ``sys.base_prefix``, ``sys.exec_prefix``)
the home folder              ``~``
the host name                ``<host>``
==========================  ===============

Longer paths are replaced first, so a run folder inside the home folder becomes
``<run folder>``, not ``~/…``. Public API: :func:`machine_names`, :func:`scrub_text`, :func:`scrub_file`.
"""
from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path


def machine_names(run_folder: str | Path | None = None) -> list[tuple[str, str]]:
    """``(text, placeholder)`` pairs to replace, longest text first. Paths shorter than five
    characters (``/``, ``/tmp``) and host names shorter than four are left alone: replacing them
    would rewrite ordinary words."""
    pairs: dict[str, str] = {}
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        pairs[os.path.realpath(path)] = "<python>"
        pairs[path] = "<python>"
    home = os.path.expanduser("~")
    pairs[home] = "~"
    pairs[os.path.realpath(home)] = "~"
    cwd = os.getcwd()
    pairs[cwd], pairs[os.path.realpath(cwd)] = "<cwd>", "<cwd>"
    if run_folder is not None:
        folder = os.path.abspath(run_folder)
        pairs[folder], pairs[os.path.realpath(folder)] = "<run folder>", "<run folder>"
    pairs = {text: name for text, name in pairs.items() if len(text) >= 5 and text != os.sep}
    host = socket.gethostname()
    found = sorted(pairs.items(), key=lambda pair: -len(pair[0]))
    if len(host) >= 4:
        found.append((host, "<host>"))
    return found


def scrub_text(text: str, names: list[tuple[str, str]]) -> str:
    """``text`` with every name of ``names`` replaced; a path is replaced only where it ends at
    a path boundary (``/home/ann`` in ``/home/ann/x`` but not in ``/home/anna``), the host name
    only as a whole word."""
    for name, placeholder in names:
        if placeholder == "<host>":
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", placeholder, text)
        else:
            text = re.sub(rf"{re.escape(name)}(?=$|[{re.escape(os.sep)}\s'\":,)\]])", placeholder, text,
                          flags=re.MULTILINE)
    return text


def scrub_file(folder: str | Path, path: str | Path) -> None:
    """Rewrite ``path``, a text file below ``folder`` (never through a link), with the machine's
    names replaced (:func:`scrub_text`, the run folder being ``folder``). Best effort: a file
    that cannot be read or written is left as it was."""
    from fusedce_profiler.instrument.confined import open_inside

    try:
        with os.fdopen(open_inside(folder, path), "rb") as source:
            text = source.read().decode("utf-8", errors="replace")
        scrubbed = scrub_text(text, machine_names(folder))
        if scrubbed != text:
            with os.fdopen(open_inside(folder, path, os.O_WRONLY | os.O_TRUNC), "wb") as target:
                target.write(scrubbed.encode("utf-8"))
    except Exception:  # noqa: BLE001 - a log that cannot be rewritten stays as the worker left it
        pass
