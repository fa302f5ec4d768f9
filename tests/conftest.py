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

# The suite runs many tiny ops; on a small shared CI machine one intra-op thread avoids
# thread hand-off costs that dominate at these sizes.
torch.set_num_threads(1)
