"""The environment block every report carries (like PyTorch's bug-report template).

Public API: :func:`collect_environment` → a JSON-serialisable dict with keys
``date`` (UTC ISO 8601), ``python``, ``platform``, ``torch``, ``triton``, ``cuda``
(torch's CUDA build, or ``None``), ``cudnn``, ``gpu`` (name or ``None``), ``gpu_count``,
``gpu_memory_bytes``, ``driver`` (from ``nvidia-smi``, or ``None``),
``pytorch_cuda_alloc_conf`` (the allocator settings, ``PYTORCH_CUDA_ALLOC_CONF`` or
``PYTORCH_ALLOC_CONF``), ``backends`` ({name: version or "not installed"}), ``libraries``
({distribution: version or "not installed"} of the libraries the model sources and patching
back-ends build on: transformers, liger-kernel, lightning), read from package metadata
without importing them.
"""
from __future__ import annotations

import datetime
from pathlib import Path
import os
import platform
import shutil
import subprocess
import sys

import torch

from fusedce_profiler.instrument.backends import installed_versions
from fusedce_profiler.instrument.backends.base import UNREADABLE_VERSION, dist_version


_TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")
"""The names Triton is installed under (PyTorch's nightly and vendor builds rename it)."""


def _triton_version() -> str | None:
    """Triton's version, read from its installed metadata: importing it (a C extension whose start
    calls back into Python) in the command's process would let a signal's exception arrive inside
    that start, which aborts the process. A build without readable metadata is imported, signals
    held; one that cannot be imported either is recorded as such, never an exception."""
    from importlib.util import find_spec

    found = dist_version(*_TRITON_DISTRIBUTIONS)
    if found is not None and found != UNREADABLE_VERSION:
        return found
    if find_spec("triton") is None:
        return found
    from fusedce_profiler.instrument.staging import signals_held

    try:
        with signals_held():
            import triton
        return str(triton.__version__)
    except (Exception, SystemExit):  # noqa: BLE001 - a damaged (or hostile) installation: still recorded
        return found or UNREADABLE_VERSION


def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


LIBRARIES = ("transformers", "liger-kernel", "lightning")


def _library_versions() -> dict[str, str]:
    return {name: dist_version(name) or "not installed" for name in LIBRARIES}


def collect_environment() -> dict:
    """Versions, GPU and allocator settings of this process (see the module docstring)."""
    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": props.name if props else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_bytes": props.total_memory if props else None,
        "driver": _driver_version() if cuda else None,
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
        "cpu_count": os.cpu_count(),
        "backends": {name: version or "not installed" for name, version in installed_versions().items()},
        "libraries": _library_versions(),
    }


def environment_job(payload: dict) -> dict:
    """The worker's ``environment`` job (taken in a worker: the parent never touches the GPU)."""
    return collect_environment()


def save_environment(folder: str | Path, environment: dict) -> Path:
    """Store ``environment`` as the folder's ``environment.json``."""
    from fusedce_profiler.instrument import store

    return store.write_json(Path(folder) / store.ENVIRONMENT_FILE, environment)


ENVIRONMENT_KEYS = ("date", "python", "platform", "torch", "triton", "cuda", "cudnn", "gpu", "gpu_count",
                    "gpu_memory_bytes", "driver", "pytorch_cuda_alloc_conf", "cpu_count", "backends", "libraries")
"""The keys :func:`collect_environment` writes, in its order; ``backends`` and ``libraries`` map
names to versions. A stored environment may add ``resumed``: the environments of later sessions."""


def _version_map_names(key: str) -> tuple[str, ...]:
    """The names :func:`collect_environment` writes under ``key`` (``"backends"`` or ``"libraries"``)."""
    from fusedce_profiler.instrument.backends.registry import BUILTIN_BACKENDS

    return tuple(BUILTIN_BACKENDS) if key == "backends" else LIBRARIES


_VERSION_MAPS = ("backends", "libraries")


_COUNTS = ("cudnn", "gpu_count", "gpu_memory_bytes", "cpu_count")
"""The keys :func:`collect_environment` writes as integers (≥ 0, or ``None``); every other scalar key is a string or ``None``."""


def _stored_as_written(key: str, value) -> bool:
    """Whether ``value`` is of the type :func:`collect_environment` writes under ``key``."""
    if value is None:
        return True
    if key in _COUNTS:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, str)


def known_environment(raw: dict, *, nested: bool = True) -> dict:
    """Only what an environment holds: the keys of :data:`ENVIRONMENT_KEYS` with values of the type
    the tool writes there (counts as integers, everything else as strings, or ``None``), the version
    maps as ``{name: version string}`` for the names the tool writes there, and ``resumed`` as a list
    of such environments. Anything else in a stored file is dropped, so a report renders no key, and
    no value, the tool did not write."""
    out: dict = {}
    for key, value in raw.items():  # in the stored order: a rebuilt report reads as it did
        if key in _VERSION_MAPS:
            if isinstance(value, dict):
                names = _version_map_names(key)
                out[key] = {k: v for k, v in value.items() if k in names and isinstance(v, str)}
        elif key in ENVIRONMENT_KEYS:
            if _stored_as_written(key, value):
                out[key] = value
        elif key == "resumed" and nested and isinstance(value, list):
            out[key] = [known_environment(item, nested=False) for item in value if isinstance(item, dict)]
    return out


STORED_ENVIRONMENT_KEYS = ("date", "python", "platform", "torch")
"""Keys every environment this tool stores holds (:func:`is_stored_environment`)."""


def is_stored_environment(raw: object) -> bool:
    """Whether ``raw`` (a parsed ``environment.json``) is an environment this tool stored: an object
    of :data:`ENVIRONMENT_KEYS` (and ``resumed``) only, holding :data:`STORED_ENVIRONMENT_KEYS` —
    not a project's own file of that name (a conda environment, a list of settings)."""
    return (isinstance(raw, dict) and set(raw) <= {*ENVIRONMENT_KEYS, "resumed"}
            and all(key in raw for key in STORED_ENVIRONMENT_KEYS))


def load_environment(folder: str | Path) -> dict:
    """The stored environment of a run (only its known keys, :func:`known_environment`); ``{}``
    when the folder has none; ``ValueError`` if damaged; a linked or oversized file is refused
    (:mod:`fusedce_profiler.instrument.confined`)."""
    from fusedce_profiler.instrument import store

    path = Path(folder) / store.ENVIRONMENT_FILE
    if not store.present(path):
        return {}
    raw = store.read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return known_environment(raw)
