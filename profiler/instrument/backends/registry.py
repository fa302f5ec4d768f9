"""The back-ends by name: the built-in losses, the model-mode ones, and a user's
``"module:callable"``."""
from __future__ import annotations

from fusedce_profiler.instrument.backends.base import Backend, BackendInfo
from fusedce_profiler.instrument.backends.fusedce_backends import FusedceBackend, FusedceFastBackend, FusedceMinBackend
from fusedce_profiler.instrument.backends.patched import LigerPatchedBackend
from fusedce_profiler.instrument.backends.third_party import CceBackend, LigerBackend
from fusedce_profiler.instrument.backends.torch_backends import TorchBackend, TorchCompileBackend, TorchNativeBackend
from fusedce_profiler.instrument.backends.user import UserBackend
from fusedce_profiler.instrument.callables import user_backend

#: Back-ends of the model mode only (they change the model, not just the loss).
MODEL_BACKENDS: dict[str, type[Backend]] = {LigerPatchedBackend.name: LigerPatchedBackend}

BUILTIN_BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (TorchBackend, TorchCompileBackend, TorchNativeBackend, FusedceBackend,
                              FusedceMinBackend, FusedceFastBackend, LigerBackend, CceBackend)
}


def get_model_backend(name: str) -> Backend:
    """A model-mode back-end: :data:`MODEL_BACKENDS` first, then :func:`get_backend`."""
    if name in MODEL_BACKENDS:
        return MODEL_BACKENDS[name]()
    return get_backend(name)


def get_backend(name: str) -> Backend:
    """The back-end called ``name`` (a built-in name or ``"module:callable"``).

    Raises ``ValueError`` naming the known back-ends for anything else. Does not import
    optional packages: that happens in :meth:`Backend.make` / :meth:`Backend.version`.
    """
    if name in BUILTIN_BACKENDS:
        return BUILTIN_BACKENDS[name]()
    if user_backend(name):
        return UserBackend(name)
    raise ValueError(f"backend {name!r} is unknown; choose one of {', '.join(BUILTIN_BACKENDS)} "
                     "or give 'package.module:callable'")


def list_backends() -> list[BackendInfo]:
    """Every built-in back-end with its version and options, or ``available=False`` and the reason.
    Reading a third-party back-end's options imports its package (seconds each: liger-kernel
    loads dozens of Triton kernels); :func:`installed_versions` does not."""
    return [cls().info() for cls in BUILTIN_BACKENDS.values()]


def installed_versions() -> dict[str, str | None]:
    """Each built-in back-end's installed version (``None``: not installed), importing no optional
    package: what choosing the back-ends of a run, or recording its environment, needs."""
    versions: dict[str, str | None] = {}
    for name, cls in BUILTIN_BACKENDS.items():
        try:
            versions[name] = cls().version()
        except ImportError:
            versions[name] = None
    return versions
