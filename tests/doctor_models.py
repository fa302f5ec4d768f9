"""Models for the doctor tests: the original report's shape, an LM head wrapped in a module.

``WrappedHeadLM``: embedding → causal blocks → final norm → ``head = Wrapper(nn.Linear(H, V))``
whose forward calls its inner ``Linear``. Variants: tied (``head.inner.weight = embed.weight``),
with a bias, the report's broken tie (``head.weight = embed.weight`` assigned on the wrapper:
the inner Linear keeps its own weight), and a spare unused (V,) parameter ``head.bias``.
The factories are ``--model tests.doctor_models:<name>`` targets.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB, HIDDEN = 96, 32


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class WrappedHeadLM(nn.Module):
    def __init__(self, *, tied: bool = False, bias: bool = False, broken_tie: bool = False, spare_bias: bool = False,
                 vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, 4, 2 * hidden, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden)
        self.head = Wrapper(nn.Linear(hidden, vocab, bias=bias))
        if tied:
            self.head.inner.weight = self.embed.weight
        if broken_tie:
            self.head.weight = self.embed.weight  # assigned on the wrapper: its forward never uses it
        if spare_bias:
            self.head.bias = nn.Parameter(torch.zeros(vocab))  # a leftover the forward never uses

    def trunk(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=input_ids.device)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return x

    def body(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.final_norm(self.trunk(input_ids))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(input_ids))


def untied():
    return WrappedHeadLM()


def tied():
    return WrappedHeadLM(tied=True)


def exits_on_meta():
    """:func:`untied` where tensors are real; ``sys.exit(0)`` where they are built on the meta device."""
    import sys

    if torch.empty(1).is_meta:
        sys.exit(0)
    return WrappedHeadLM()


def counted():
    """:func:`untied`, each call's process id appended to the file ``FUSEDCE_TEST_FACTORY_CALLS`` names."""
    import os

    with open(os.environ["FUSEDCE_TEST_FACTORY_CALLS"], "a") as calls:
        calls.write(f"{os.getpid()}\n")
    return WrappedHeadLM()


def untied_bias():
    return WrappedHeadLM(bias=True)


def tied_bias():
    return WrappedHeadLM(tied=True, bias=True)


def broken_tie():
    return WrappedHeadLM(broken_tie=True)


def spare_bias():
    return WrappedHeadLM(spare_bias=True)


class _LossConfig:
    """A config asking its loss for label smoothing and a z-loss (what a user's model config says)."""

    label_smoothing = 0.1
    z_loss = 1e-2


def configured():
    model = WrappedHeadLM()
    model.config = _LossConfig()
    return model


def factory_raises():
    raise RuntimeError("the factory's own bug")


def factory_exits():
    import sys

    sys.exit(0)


def fsdp_untied():
    """The untied model with FSDP2 (``fully_shard``) on each block, the embedding, the final norm,
    the head and the root, over the initialised process group (the CPU's gloo in the tests)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = WrappedHeadLM()
    if not dist.is_initialized() or next(model.parameters()).is_meta:
        return model
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in (*model.blocks, model.embed, model.final_norm, model.head):
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def set_size(vocab: int, hidden: int, layers: int = 2) -> None:
    """Make every factory above build ``vocab`` × ``hidden`` models with ``layers`` blocks (the
    device suite's larger sizes)."""
    WrappedHeadLM.__init__.__kwdefaults__.update(vocab=vocab, hidden=hidden, layers=layers)
