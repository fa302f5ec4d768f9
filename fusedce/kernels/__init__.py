"""The :class:`~fusedce.block_math.BlockMath` of Triton kernels (``impl="triton"``).

Runs on CUDA tensors, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``).
The block kernels' modules each hold one ``@triton.jit`` kernel and the launcher that sizes its grid; the
launchers are this package's ``chunk_stats``, ``logit_grad`` and ``scale_``, with the signatures,
shapes and semantics of :class:`fusedce.block_math.BlockMath` (fp32 blocks only). Neither
allocates a block-sized tensor: ``logit_grad`` writes the gradients over the logits block.

It is also a :class:`fusedce.block_math.TileMath` (:mod:`fusedce.kernels.tiles`: the product and
the math in one kernel, on GPUs with tensor-memory copies) where this Triton has tensor
descriptors.
"""
from fusedce.kernels.chunk_stats import chunk_stats
from fusedce.kernels.logit_grad import logit_grad
from fusedce.kernels.scale import scale_

__all__ = ["chunk_stats", "logit_grad", "scale_"]

try:
    from fusedce.kernels.tiles import partial_bytes, tile_grad, tile_stats, tiles_planned, tiles_supported
except ImportError:  # a Triton without host-side tensor descriptors: the block kernels alone
    pass
else:
    __all__ += ["partial_bytes", "tile_grad", "tile_stats", "tiles_planned", "tiles_supported"]
