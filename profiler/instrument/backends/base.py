"""The interface every LM-head loss back-end implements, and the helpers they share.

Every back-end turns ``(hidden, weight, target, bias, options) -> loss``:

- ``hidden``: (N, H) in the mode's hidden dtype, ``requires_grad``.
- ``weight``: (V, H) in the mode's weight dtype (fp32 under amp), ``requires_grad``.
- ``target``: (N,) int64, ``options.ignore_index`` marks ignored rows.
- ``bias``: (V,) like ``weight``, or ``None``.
- returns: a scalar (``reduction`` "mean"/"sum") or (N,) (``"none"``).

The caller runs the forward under the cell's autocast, exactly as a training loop would.

A back-end that cannot honour an option of a cell says why in :meth:`Backend.unsupported`
and the cell is recorded as ``skipped``; one whose package is missing raises
``ImportError`` from :meth:`Backend.version`, which :meth:`Backend.info` reports as
"not installed".
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from fusedce.options import LossOptions
from fusedce_profiler.instrument.records import CellSpec


def options_of(spec: CellSpec) -> LossOptions:
    """The loss options of a grid cell."""
    return LossOptions(**spec.options())


def active_options(options: LossOptions) -> set[str]:
    """Names of the options that differ from a plain mean cross-entropy."""
    used = set()
    if options.reduction != "mean":
        used.add(f"reduction={options.reduction}")
    if options.label_smoothing:
        used.add("label_smoothing")
    if options.z_loss:
        used.add("z_loss")
    if options.softcap is not None:
        used.add("softcap")
    return used


LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", LossOptions], torch.Tensor]


@dataclass(frozen=True)
class BackendInfo:
    """What :func:`fusedce_profiler.instrument.backends.list_backends` reports for one back-end.

    ``version`` is ``None`` and ``reason`` says why when the back-end is not available.
    ``options`` lists the non-default options it honours (``"bias"``, ``"ignore_index"``,
    ``"label_smoothing"``, ``"z_loss"``, ``"softcap"``, ``"reduction=sum"``,
    ``"reduction=none"``); ``devices`` the devices it runs on.
    """

    name: str
    available: bool
    version: str | None
    reason: str
    devices: tuple[str, ...]
    options: tuple[str, ...]
    description: str


ALL_OPTIONS = ("bias", "ignore_index", "label_smoothing", "z_loss", "softcap", "reduction=sum", "reduction=none")


def require(module: str) -> None:
    """Raise ``ImportError`` if ``module`` cannot be imported, without importing it."""
    try:
        found = sys.modules[module] if module in sys.modules else importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ImportError(f"No module named {module!r}")


UNREADABLE_VERSION = "unknown (its metadata cannot be read)"


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution in ``names`` that is installed (``None``: none
    is); :data:`UNREADABLE_VERSION` for one whose metadata is damaged (not UTF-8, a folder, no
    ``Version``) — never an exception, since every command records the environment."""
    for name in names:
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a damaged METADATA: UnicodeDecodeError, OSError, ...
            return UNREADABLE_VERSION
        return found if isinstance(found, str) and found else UNREADABLE_VERSION
    return None


class Backend:
    """One loss implementation. Subclasses set the class attributes and :meth:`make`."""

    name: str = ""
    description: str = ""
    devices: tuple[str, ...] = ("cuda", "cpu")
    options: tuple[str, ...] = ALL_OPTIONS
    cpu_first_step_is_warm: bool = False
    """Its first step on the CPU allocates and does nothing once (plain eager ops): a first step
    holds the bytes of any later one (``tests/test_profiler_backends.py``), so it needs no warm-up
    there. On a GPU every back-end warms up (cuBLAS's workspace, compiling, autotuning)."""

    def version(self) -> str:
        """The installed version; raises ``ImportError`` when the back-end is missing."""
        return torch.__version__

    def make(self) -> LossFn:
        """Import lazily and return the loss function."""
        raise NotImplementedError

    def needs_warmup(self, device: str) -> bool:
        """Whether its first step on ``device`` (``cuda``, ``cuda:K``, ``cpu``) does work once —
        compiling, autotuning, a library's workspace — that a warm-up step must take out of the
        metered one: everywhere but on the CPU for a back-end whose :attr:`cpu_first_step_is_warm`."""
        return not (self.cpu_first_step_is_warm and device.startswith("cpu"))

    def info(self) -> BackendInfo:
        try:
            version, available, reason = self.version(), True, ""
        except ImportError as exc:
            version, available, reason = None, False, f"not installed ({exc})"
        return BackendInfo(self.name, available, version, reason, self.devices, self.options,
                           self.description)

    def unsupported(self, spec: CellSpec) -> str | None:
        """Why this back-end cannot run ``spec`` (``None`` when it can)."""
        try:
            self.version()
        except ImportError as exc:
            return f"{self.name} is not available: not installed ({exc})"
        device = spec.device.split(":")[0]
        if device not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)} only, not {device}"
        wanted = active_options(options_of(spec))
        if spec.bias:
            wanted.add("bias")
        if spec.ignore_frac:
            wanted.add("ignore_index")
        missing = sorted(wanted - set(self.options))
        if missing:
            return f"{self.name} does not support {', '.join(missing)}"
        return None
