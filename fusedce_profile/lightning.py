"""``StepRecorderCallback`` for ``lightning`` (``import lightning as L``; falls back to
``pytorch_lightning`` when only that is installed). See :mod:`fusedce_profile._lightning`."""
from __future__ import annotations

import importlib.util

from fusedce_profile._lightning import make_callback_class

_PACKAGE = "lightning.pytorch" if importlib.util.find_spec("lightning") is not None else "pytorch_lightning"
StepRecorderCallback = make_callback_class(_PACKAGE)

__all__ = ["StepRecorderCallback"]
