"""fusedce: a fused linear + cross-entropy loss that never materialises the N×V logits."""
from fusedce.api import LinearCrossEntropyLoss, linear_cross_entropy

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss"]
__version__ = "0.1.0"
