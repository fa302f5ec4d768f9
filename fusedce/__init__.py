"""fusedce: a fused linear + cross-entropy loss that never materialises the N×V logits."""
from fusedce.options import IGNORE_INDEX

__all__ = ["linear_cross_entropy", "LinearCrossEntropyLoss", "IGNORE_INDEX", "vocab_parallel_linear_cross_entropy",
           "vocab_shard_bounds", "MemoryBudgetWarning"]
__version__ = "0.1.0"

_LAZY = {"linear_cross_entropy": "fusedce.api", "LinearCrossEntropyLoss": "fusedce.api",
         "vocab_parallel_linear_cross_entropy": "fusedce.parallel", "vocab_shard_bounds": "fusedce.parallel",
         "MemoryBudgetWarning": "fusedce.budget_warning"}


def __getattr__(name: str):
    """The loss, imported on first use: ``import fusedce`` (and a command that reads only its
    options, such as ``fusedce-profile``'s start) does not import torch (~1.2 s of CPU), nor
    :mod:`fusedce.parallel`, whose ``torch.compiler.disable`` imports ``torch._dynamo`` (~1.2 s more)."""
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:  # ``fusedce.api.…`` after a bare ``import fusedce``
        return importlib.import_module(f"fusedce.{name}")
    raise AttributeError(f"module 'fusedce' has no attribute {name!r}")


_SUBMODULES = ("api", "parallel", "options")
"""The public submodules, reached as attributes of the package (each imported on first use)."""


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
