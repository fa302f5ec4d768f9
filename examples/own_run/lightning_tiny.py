"""Record a training step of a tiny LightningModule with fusedce-profile's callback (CPU or GPU).

    python examples/own_run/lightning_tiny.py --out runs/lightning-tiny            # naive loss
    python examples/own_run/lightning_tiny.py --out runs/lightning-tiny --fused --append
    fusedce-profile report runs/lightning-tiny                                       # rebuild anywhere

The model is the shape of the original report's (embedding → blocks → final norm → LM head),
tiny; ``--fused`` computes the loss with ``fusedce.linear_cross_entropy`` from the head's input
and weight instead of materialising the logits. The callback records the training steps named
by ``--steps`` (0-based ``trainer.global_step``) and what the sanity check and validation left
reserved before them, and writes ``summary.md`` into the folder.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import lightning as L
    from fusedce_profile.lightning import StepRecorderCallback
except ImportError:  # only the older package is installed
    import pytorch_lightning as L
    from fusedce_profile.pytorch_lightning import StepRecorderCallback

from fusedce import linear_cross_entropy


class RandomTokens(Dataset):
    """``{"input_ids", "labels"}`` of random tokens; labels are the inputs (HF convention, unshifted)."""

    def __init__(self, vocab: int, seq: int, size: int = 64, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (size, seq), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class TinyLM(L.LightningModule):
    def __init__(self, vocab: int = 512, hidden: int = 64, layers: int = 2, heads: int = 4, fused: bool = False):
        super().__init__()
        self.fused = fused
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def body(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) → (B, T, H) hidden states after the final norm (what the head reads)."""
        t = input_ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=input_ids.device)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.final_norm(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.body(input_ids))

    def loss(self, batch) -> torch.Tensor:
        ids, labels = batch["input_ids"], batch["labels"]
        if self.fused:  # never materialises the (B, T, V) logits
            hidden = self.body(ids)
            return linear_cross_entropy(hidden[:, :-1], self.lm_head.weight, labels[:, 1:])
        logits = self(ids)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def validation_step(self, batch, batch_idx):
        logits = self(batch["input_ids"])  # full logits, as an accuracy metric would
        self.log("val_loss", F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten()))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/lightning-tiny"))
    parser.add_argument("--fused", action="store_true", help="fusedce.linear_cross_entropy instead of the logits")
    parser.add_argument("--steps", type=int, nargs="+", default=[1], help="0-based global steps to record")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--precision", default="bf16-mixed", help="Lightning precision (bf16-mixed, 32-true, ...)")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--append", action="store_true", help="add to a recording already in --out")
    parser.add_argument("--force", action="store_true", help="replace a recording already in --out")
    args = parser.parse_args(argv)

    L.seed_everything(0, verbose=False)
    model = TinyLM(args.vocab, args.hidden, args.layers, args.heads, fused=args.fused)
    data = RandomTokens(args.vocab, args.seq)
    label = "fused" if args.fused else "naive"
    callback = StepRecorderCallback(steps=args.steps, out=args.out, label=label, fused=args.fused,
                                    append=args.append, force=args.force)
    trainer = L.Trainer(max_steps=args.max_steps, precision=args.precision, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, limit_val_batches=1, val_check_interval=1, check_val_every_n_epoch=None,
                        default_root_dir=str(args.out.parent))
    trainer.fit(model, DataLoader(data, batch_size=args.batch), DataLoader(data, batch_size=args.batch))
    print(f"recorded {args.out / 'summary.md'}")
    return args.out


if __name__ == "__main__":
    main()
