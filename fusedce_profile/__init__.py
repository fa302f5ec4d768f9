"""``fusedce_profile``: record a training step from inside your own loop, and ``doctor``'s contract.

- :class:`StepRecorder`, :func:`record_step` (:mod:`fusedce_profile.recorder`): the named steps
  of any loop, written as a run folder that ``fusedce-profile report DIR`` renders.
- ``fusedce_profile.lightning.StepRecorderCallback`` (``lightning``), and
  ``fusedce_profile.pytorch_lightning.StepRecorderCallback`` (``pytorch_lightning``): the same
  inside ``Trainer.fit``.
- ``fusedce_profile.hf.StepRecorderCallback``: the same inside ``transformers.Trainer``.

The integrations are imported only from their own submodules (Lightning and transformers are
optional: ``pip install "fusedce[lightning]"`` / ``"fusedce[hf]"``).
"""
from fusedce_profile.recorder import StepRecorder, record_step, write_report

__all__ = ["StepRecorder", "record_step", "write_report"]
