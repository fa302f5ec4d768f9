"""fusedce: a fused linear + cross-entropy loss that never materialises the N×V logits."""
from fusedce.api import LinearCrossEntropyLoss, linear_cross_entropy
from fusedce.options import IGNORE_INDEX

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "IGNORE_INDEX", "vocab_parallel_linear_cross_entropy",
           "vocab_shard_bounds"]
__version__ = "0.1.0"

_VOCAB_PARALLEL = ("vocab_parallel_linear_cross_entropy", "vocab_shard_bounds")


def __getattr__(name: str):
    """The vocabulary-parallel names, imported on first use: :mod:`fusedce.parallel` marks its
    loss ``torch.compiler.disable``, which imports ``torch._dynamo`` (~1.2 s on a laptop-class CPU)."""
    if name in _VOCAB_PARALLEL:
        from fusedce import parallel

        return getattr(parallel, name)
    raise AttributeError(f"module 'fusedce' has no attribute {name!r}")
