"""Record steps 2 and 5 of a plain PyTorch training loop, naive loss then fused loss (CPU or GPU).

    python examples/own_run/plain_loop.py --out runs/plain          # both runs into one folder
    fusedce-profile report runs/plain                                # rebuild anywhere

The model is ``examples/user_model.py``'s (a GPT whose LM head sits in a wrapper). The naive run
computes the logits and ``F.cross_entropy``; the fused run passes the final norm's output and
the head's weight to ``fusedce.linear_cross_entropy``. Each loop wraps one step — forward,
loss, backward, optimizer — in ``with recorder.step():``; only the named steps are recorded,
the others run with no hook installed. On a GPU the steps run under bf16 autocast.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `examples` importable from a checkout

from examples.doctor_losses import hidden_states  # noqa: E402
from examples.user_model import UserGPT  # noqa: E402
from fusedce import linear_cross_entropy  # noqa: E402
from fusedce_profile import StepRecorder  # noqa: E402


def train(out: Path, fused: bool, steps: int, batch: int, seq: int, device: str, append: bool) -> None:
    torch.manual_seed(0)
    model = UserGPT(vocab=2048, hidden=128, layers=2, heads=4, max_len=seq).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = StepRecorder(model, out, steps=(2, 5), label="fused" if fused else "naive", fused=fused,
                            append=append, force=not append)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 2048, (batch, seq), generator=gen).to(device)
        with recorder.step(), torch.autocast(device.split(":")[0], torch.bfloat16, enabled=device.startswith("cuda")):
            if fused:
                hidden = hidden_states(model, ids)[:, :-1]
                loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), model.head.proj.weight,
                                            ids[:, 1:].reshape(-1))
            else:
                logits = model(ids)[:, :-1]
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    recorder.close()


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/plain"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    train(args.out, False, args.steps, args.batch, args.seq, args.device, append=False)
    train(args.out, True, args.steps, args.batch, args.seq, args.device, append=True)
    print(f"recorded {args.out / 'summary.md'}")
    return args.out


if __name__ == "__main__":
    main()
