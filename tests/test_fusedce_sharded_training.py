"""The recipes of ``docs/distributed.md``: FSDP2, tensor parallel and DDP on the CPU (gloo, 2 ranks).

The page's code blocks are executed as they stand in it and the models they build are checked
against one process:

- FSDP2 with bf16 parameters and fp32 reduction (torch 2.13 runs ``fully_shard`` on the CPU
  with gloo): the loss inside the root's forward and through a method registered with
  ``register_fsdp_forward_method`` give the same gradients, equal to the mean over the ranks'
  batches of a bf16 copy of the model in one process; outside a forward the head's weight is a
  sharded DTensor and ``linear_cross_entropy`` refuses it naming both fixes.
- Tensor parallel (``ColwiseParallel`` head, and a tied head through a ``RowwiseParallel``
  embedding): the same batch on both ranks, loss and every gradient as in one process, grad_W a
  ``Shard(0)`` DTensor.
- DDP: gradients equal the mean of the ranks' one-process gradients.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

import fusedce
from distributed import run_world
from reference import relative_error

PAGE = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"
V, H, B, T = 37, 16, 2, 5


def recipe() -> dict:
    """The namespace left by running the python blocks of ``docs/distributed.md``."""
    text = PAGE.read_text()
    blocks = list(re.finditer(r"```python\n(.*?)```", text, flags=re.S))
    assert len(blocks) >= 3, "docs/distributed.md lost its code blocks"
    namespace: dict = {"__name__": "docs_recipe"}
    for block in blocks:  # padded to its line in the page, so that tracebacks point there
        line = text.count("\n", 0, block.start(1))
        exec(compile("\n" * line + block.group(1), str(PAGE), "exec"), namespace)
    return namespace


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=gen)
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, 0] = -100
    return ids, labels


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's gradient as a full plain fp32 tensor (DTensors gathered)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[name] = None if g is None else g.detach().float().clone()
    return out


def _one_process_grads(model: torch.nn.Module, batches, dtype=torch.float32):
    """Mean over ``batches`` of one-process gradients of ``model`` cast to ``dtype``, and the losses."""
    total, losses = None, []
    for ids, labels in batches:
        replica = copy.deepcopy(model).to(dtype)
        loss = replica(ids, labels)
        loss.backward()
        losses.append(loss.detach())
        grads = _grads(replica)
        total = grads if total is None else {k: total[k] + grads[k] for k in total}
    return {k: g / len(batches) for k, g in total.items()}, losses


def _assert_grads(got: dict, want: dict, rtol: float, what: str) -> None:
    assert got.keys() == want.keys()
    for name in got:
        err = relative_error(got[name], want[name])
        assert err <= rtol, f"{what}: {name} relative error {err:.3g} > {rtol:g}"


def _fsdp2(rank: int, world: int) -> None:
    from torch.distributed.tensor import DTensor

    ns = recipe()
    torch.manual_seed(0)
    model = ns["TinyLM"](V, H, tied=True)
    reference = copy.deepcopy(model)
    model = ns["shard_fsdp2"](model)
    batches = [_batch(r) for r in range(world)]
    ids, labels = batches[rank]
    assert isinstance(model.lm_head.weight, DTensor) and model.lm_head.weight is model.embed.weight
    assert model.lm_head.weight.to_local().shape[0] == (19 if rank == 0 else 18)  # torch.chunk's split of 37

    loss = model(ids, labels)  # 1. the loss inside the root's forward
    assert loss.dtype == torch.float32
    loss.backward()
    inside = _grads(model)
    model.zero_grad(set_to_none=True)
    h = model(ids)  # 2. the registered method
    assert h.dtype == torch.bfloat16
    method_loss = model.loss(h, labels)
    method_loss.backward()
    registered = _grads(model)
    model.zero_grad(set_to_none=True)

    want, losses = _one_process_grads(reference, batches, torch.bfloat16)
    assert torch.equal(loss, method_loss)
    torch.testing.assert_close(loss, losses[rank].float(), rtol=1e-6, atol=0)
    _assert_grads(registered, inside, 1e-6, "registered method vs forward")
    _assert_grads(inside, want, 1e-2, "FSDP2 vs one process")
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError, match="register_fsdp_forward_method"):  # outside a forward: sharded
        fusedce.linear_cross_entropy(h.detach(), model.lm_head.weight, labels)


def _tensor_parallel(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    ns = recipe()
    mesh = init_device_mesh("cpu", (world,))
    ids, labels = _batch(7)  # one batch: every rank sees the same tokens
    for tied in (False, True):
        torch.manual_seed(1)
        single = ns["TinyLM"](V, H, tied=tied)
        want, losses = _one_process_grads(single, [(ids, labels)])
        model = ns["TensorParallelLM"](V, H, tied=tied)
        model.load_state_dict(single.state_dict())
        model = ns["shard_tensor_parallel"](model, mesh)
        weight = model.lm_head.weight
        assert isinstance(weight, DTensor) and weight.placements == (Shard(0),)
        assert (weight is model.embed.weight) == tied
        loss = model(ids, labels)
        loss.backward()
        assert isinstance(weight.grad, DTensor) and weight.grad.placements == (Shard(0),)
        torch.testing.assert_close(loss, losses[0], rtol=1e-6, atol=0)
        _assert_grads(_grads(model), want, 1e-5, f"tensor parallel (tied={tied})")


def _ddp(rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    ns = recipe()
    torch.manual_seed(2)
    model = ns["TinyLM"](V, H, tied=True)
    batches = [_batch(10 + r) for r in range(world)]
    want, losses = _one_process_grads(model, batches)
    ddp = DistributedDataParallel(copy.deepcopy(model))
    loss = ddp(*batches[rank])
    loss.backward()
    torch.testing.assert_close(loss, losses[rank], rtol=1e-6, atol=0)
    _assert_grads(_grads(ddp.module), want, 1e-5, "DDP")


def _sharded_training(rank: int, world: int) -> None:
    _fsdp2(rank, world)
    _tensor_parallel(rank, world)
    _ddp(rank, world)


def test_readme_recipe_trains_with_fsdp2_tensor_parallel_and_ddp_like_one_process():
    run_world(_sharded_training, 2, timeout_s=150)


def test_readme_recipe_runs_in_one_process():
    ns = recipe()
    model = ns["TinyLM"](V, H, tied=True)
    ids, labels = _batch(3)
    loss = model(ids, labels)
    loss.backward()
    assert torch.isfinite(loss) and model.embed.weight.grad is not None
