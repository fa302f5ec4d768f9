"""``StepRecorderCallback`` for ``pytorch_lightning`` 2.x (``import pytorch_lightning as pl``).
See :mod:`fusedce_profile._lightning`."""
from __future__ import annotations

from fusedce_profile._lightning import make_callback_class

StepRecorderCallback = make_callback_class("pytorch_lightning")

__all__ = ["StepRecorderCallback"]
