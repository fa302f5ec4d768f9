"""Triton kernels for the per-chunk softmax math (the CUDA implementation).

Each module holds one ``@triton.jit`` kernel and the launcher that sizes its grid. The
launchers have the same signatures as :mod:`fusedce.block_math_torch`.
"""
from fusedce.kernels.chunk_stats import chunk_stats
from fusedce.kernels.logit_grad import logit_grad

__all__ = ["chunk_stats", "logit_grad"]
