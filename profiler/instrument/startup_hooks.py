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
    """The start-up hooks (``sitecustomize``, ``usercustomize``: a module, a package, compiled or not)
    an interpreter given ``path`` (a ``PYTHONPATH``) would import — the first of each name along it,
    found as the import system finds it — other than a hook of the Python installation itself
    (:func:`interpreter_folders`): a worker given another starts fresh, so that the hook runs in it,
    once, as it would in a fresh interpreter (in a forked worker it would only have run in the
    template). An empty entry is the current folder, as for an interpreter."""
    from importlib.machinery import PathFinder

    own = interpreter_folders()
    folders = [folder or os.getcwd() for folder in path.split(os.pathsep)] if path else []
    found = []
    for name in ("sitecustomize", "usercustomize"):
        spec = PathFinder.find_spec(name, folders)
        if spec is None or not spec.has_location or spec.origin is None:
            continue
        home = os.path.dirname(spec.origin)
        if spec.submodule_search_locations:  # a package: the folder that holds it
            home = os.path.dirname(home)
        if os.path.realpath(home) not in own:
            found.append(spec.origin)
    return found
