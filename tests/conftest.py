"""Test session set-up.

Without CUDA, Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) on CPU
tensors. The variable is read when a kernel is decorated, so it is set here, before any
test module imports ``fusedce``.
"""
import os

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import matplotlib

matplotlib.use("Agg")
