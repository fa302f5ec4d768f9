"""fusedce: a fused linear + cross-entropy loss that never materialises the N×V logits."""
from fusedce.api import LinearCrossEntropyLoss, linear_cross_entropy
from fusedce.options import IGNORE_INDEX
from fusedce.parallel import vocab_parallel_linear_cross_entropy, vocab_shard_bounds

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "IGNORE_INDEX", "vocab_parallel_linear_cross_entropy",
           "vocab_shard_bounds"]
__version__ = "0.1.0"
