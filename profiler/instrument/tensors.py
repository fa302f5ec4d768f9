"""Bytes held by tensors: distinct storages counted once, and an optimizer's state tensors."""
from __future__ import annotations

import torch


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the tensors in ``tensors`` (shared storages counted
    once; ``None`` and other non-tensors skipped)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer, device: torch.device) -> list[torch.Tensor]:
    """The state tensors on ``device`` of ``optimizer``, or of the optimizer it wraps (Lightning's
    and accelerate's wrappers hold it as ``.optimizer``); AdamW keeps its step counters on the CPU."""
    inner = getattr(optimizer, "optimizer", optimizer)
    state = getattr(inner, "state", {}) or {}
    return [v for s in state.values() for v in (s.values() if isinstance(s, dict) else ())
            if isinstance(v, torch.Tensor) and v.device == device]
