"""fusedce: a fused linear + cross-entropy loss that never materialises the N×V logits."""
from fusedce.api import LinearCrossEntropyLoss, linear_cross_entropy
from fusedce.options import IGNORE_INDEX

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "IGNORE_INDEX"]
__version__ = "0.1.0"
