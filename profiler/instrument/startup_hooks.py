"""Start-up hooks: the ``sitecustomize.py`` / ``usercustomize.py`` an interpreter runs as it starts.

A worker forked from a worker template (:mod:`fusedce_profiler.instrument.template`) starts no
interpreter: a hook on its ``PYTHONPATH`` would have run only in the template. Such a worker starts
fresh instead, so that the hook runs in it as it would in any new interpreter. A hook of the Python
installation itself runs in every interpreter of it, the template's included, and changes nothing.

Public API: :func:`startup_hooks`, :func:`interpreter_folders`.
"""
from __future__ import annotations

import os


def interpreter_folders() -> set[str]:
    """The folders of this Python's own installation (its standard library, its site-packages): a
    start-up hook there (a distribution's, such as Debian's ``sitecustomize``) runs in every one of
    its interpreters, whatever their ``PYTHONPATH``, the template's included."""
    import site
    import sysconfig

    folders = {sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(getattr(site, "getsitepackages", lambda: [])())
    return {os.path.realpath(folder) for folder in folders if folder}


def startup_hooks(path: str) -> list[str]:
    """The start-up hooks (``sitecustomize.py``, ``usercustomize.py``) an interpreter given ``path`` (a
    ``PYTHONPATH``) would run — the first of each name along it — other than a hook of the Python
    installation itself (:func:`interpreter_folders`): a worker given another starts fresh, so that
    the hook runs in it, once, as it would in a fresh interpreter (in a forked worker it would only
    have run in the template)."""
    own = interpreter_folders()
    found = []
    for name in ("sitecustomize", "usercustomize"):
        first = next((os.path.join(folder, f"{name}.py") for folder in path.split(os.pathsep)
                      if folder and os.path.isfile(os.path.join(folder, f"{name}.py"))), None)
        if first is not None and os.path.realpath(os.path.dirname(first)) not in own:
            found.append(first)
    return found
