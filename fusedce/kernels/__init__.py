"""The :class:`~fusedce.block_math.BlockMath` of Triton kernels (``impl="triton"``).

Runs on CUDA tensors, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``).
Each module holds one ``@triton.jit`` kernel and the launcher that sizes its grid; the
launchers are this package's ``chunk_stats`` and ``logit_grad``, with the signatures,
shapes and semantics of :class:`fusedce.block_math.BlockMath` (fp32 blocks only). Neither
allocates a block-sized tensor: ``logit_grad`` writes the gradients over the logits block.
"""
from fusedce.kernels.chunk_stats import chunk_stats
from fusedce.kernels.logit_grad import logit_grad

__all__ = ["chunk_stats", "logit_grad"]
