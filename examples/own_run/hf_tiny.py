"""Record a training step of a tiny Hugging Face Llama with fusedce-profile's Trainer callback.

    python examples/own_run/hf_tiny.py --out runs/hf-tiny
    fusedce-profile report runs/hf-tiny

The model is built with ``from_config`` (random weights, nothing downloaded); the Trainer runs
``--max-steps`` steps with an evaluation after step 1, and the callback records the training
steps named by ``--steps`` (0-based ``state.global_step``) into ``--out``. The loss is the
model's own (``labels`` passed, shifted inside the model).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from fusedce_profile.hf import StepRecorderCallback


class RandomTokens(Dataset):
    def __init__(self, vocab: int, seq: int, size: int = 32, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (size, seq), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/hf-tiny"))
    parser.add_argument("--steps", type=int, nargs="+", default=[1])
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (GPU)")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=max(64, args.seq))
    model = LlamaForCausalLM(config)
    data = RandomTokens(args.vocab, args.seq)
    with tempfile.TemporaryDirectory() as scratch:  # the Trainer's own output (checkpoints: none)
        training = TrainingArguments(output_dir=scratch, max_steps=args.max_steps, per_device_train_batch_size=args.batch,
                                     per_device_eval_batch_size=args.batch, eval_strategy="steps", eval_steps=1,
                                     save_strategy="no", report_to=[], logging_strategy="no", bf16=args.bf16,
                                     use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                                     disable_tqdm=True, learning_rate=1e-3)
        callback = StepRecorderCallback(steps=args.steps, out=args.out, label="hf", force=args.force)
        trainer = Trainer(model=model, args=training, train_dataset=data, eval_dataset=RandomTokens(args.vocab, args.seq, 8),
                          callbacks=[callback])
        trainer.train()
    print(f"recorded {args.out / 'summary.md'}")
    return args.out


if __name__ == "__main__":
    main()
