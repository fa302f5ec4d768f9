"""The fp32 reference that every implementation's loss and gradients are compared with.

The inputs are upcast to fp32 (TF32 off) and the loss is computed in row chunks, each
chunk's gradients accumulated before the next: the largest temporary is a few
chunk × V fp32 tensors (about 1 GiB each by default), so the reference fits wherever the
inputs fit.

Per non-ignored token i, with z = softcap(h_i·Wᵀ + b) (softcap(x) = c·tanh(x/c)),
lse = log Σ_j exp z_j and ε the label smoothing:

    loss_i = (1 − ε)·(lse − z_{y_i}) + ε·(lse − mean_j z_j) + z_loss · lse²

and the mean reduction divides Σ_i loss_i by the number of non-ignored tokens
(``F.cross_entropy``'s label smoothing, PaLM's z-loss).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from benchmarks.protocol import IGNORE_INDEX, Inputs

DEFAULT_CHUNK_ELEMENTS = 1 << 28  # chunk rows × V: 1 GiB of fp32 logits


@dataclass
class Reference:
    """fp32 loss (0-d tensor) and fp32 gradients of the inputs (grad_bias None without bias)."""

    loss: torch.Tensor
    grad_hidden: torch.Tensor
    grad_weight: torch.Tensor
    grad_bias: torch.Tensor | None


@contextlib.contextmanager
def _full_fp32_matmul():
    """Disable TF32 for the duration (the reference must be true fp32)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def token_losses(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = IGNORE_INDEX,
                 label_smoothing: float = 0.0, z_loss: float = 0.0,
                 softcap: float | None = None) -> torch.Tensor:
    """Per-token loss (N,) from raw logits (N, V) in their dtype; 0 at ignored tokens."""
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    safe_target = torch.where(valid, target, torch.zeros_like(target))
    lse = torch.logsumexp(logits, dim=-1)
    loss = lse - logits.gather(1, safe_target[:, None]).squeeze(1)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - logits.mean(dim=-1))
    if z_loss:
        loss = loss + z_loss * lse.square()
    return torch.where(valid, loss, torch.zeros_like(loss))


def reference_loss_and_grads(inputs: Inputs, *, ignore_index: int = IGNORE_INDEX,
                             label_smoothing: float = 0.0, z_loss: float = 0.0,
                             softcap: float | None = None,
                             chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> Reference:
    """Mean-reduced loss and its gradients in fp32, computed ``chunk_elements // V`` rows at a time."""
    hidden, target = inputs.hidden.detach(), inputs.target
    n, v = hidden.shape[0], inputs.weight.shape[0]
    if chunk_elements <= 0:
        raise ValueError(f"chunk_elements must be positive, got {chunk_elements!r}")
    rows = max(1, chunk_elements // v)
    weight = inputs.weight.detach().float().requires_grad_()
    bias = inputs.bias.detach().float().requires_grad_() if inputs.bias is not None else None
    n_valid = (target != ignore_index).sum().clamp_min(1).float()
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    with _full_fp32_matmul(), torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            h_chunk = hidden[start:stop].float().requires_grad_()
            logits = torch.nn.functional.linear(h_chunk, weight, bias)
            chunk_loss = token_losses(logits, target[start:stop], ignore_index=ignore_index,
                                      label_smoothing=label_smoothing, z_loss=z_loss,
                                      softcap=softcap).sum() / n_valid
            chunk_loss.backward()
            grad_hidden[start:stop] = h_chunk.grad
            total += chunk_loss.detach()
            del logits, chunk_loss, h_chunk
    if n == 0:
        zeros = torch.zeros_like(weight)
        return Reference(total, grad_hidden, zeros, torch.zeros_like(bias) if bias is not None else None)
    return Reference(total, grad_hidden, weight.grad, bias.grad if bias is not None else None)
