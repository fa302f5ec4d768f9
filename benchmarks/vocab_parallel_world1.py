"""One GPU: the vocabulary-parallel loss at world size 1 against the plain fused loss.

At world size 1 ``vocab_parallel_linear_cross_entropy`` runs the same passes as
``linear_cross_entropy`` plus its collectives (over a one-process NCCL group, gloo on the
CPU) and its (2, R) statistics buffer. This measures, per shape, with the profiler's
protocol (:mod:`fusedce_profiler.instrument.protocol`: settle, meter the forward and backward phases, time
forward+backward with CUDA events): peak extra bytes of each phase, the median step time,
the memory model's prediction for each, and the largest relative difference of loss and
gradients between the two.

Writes ``vocab_parallel_world1.jsonl`` (one row per shape and loss, written as it is
measured, so a failing shape keeps the others) and ``environment.json`` under ``--out``.
``DRY=1``: the CPU, gloo, tiny shapes (a check of the script, not a measurement).

    python3 benchmarks/vocab_parallel_world1.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

import fusedce
from fusedce.memory_model import predict_peak_bytes, predict_vocab_parallel_peak_bytes
from fusedce_profiler.instrument.environment import collect_environment, save_environment
from fusedce_profiler.instrument.protocol import MemoryMeter, settle, time_calls
from fusedce_profiler.instrument.reference import relative_error

GPU_SHAPES = [(8192, 768, 32777), (16384, 4096, 128256), (32768, 4096, 128256)]  # (N, H, V)
DRY_SHAPES = [(64, 16, 301), (96, 8, 1000)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(n: int, h: int, v: int, device: str):
    gen = torch.Generator(device=device).manual_seed(n + h + v)
    hidden = torch.randn(n, h, device=device, generator=gen, dtype=torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, device=device, generator=gen) * h ** -0.5).requires_grad_()
    target = torch.randint(0, v, (n,), device=device, generator=gen)
    target[::11] = fusedce.IGNORE_INDEX
    return hidden, weight, target


def _measure(loss_fn, n: int, h: int, v: int, device: str, repeats: int) -> dict:
    """Peak extra bytes of forward and backward (inputs allocated before), step times, grads."""
    hidden, weight, target = _inputs(n, h, v, device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(hidden, weight, target)
        loss.backward()
        return loss

    def clear():
        hidden.grad = weight.grad = None

    step()  # warm-up (kernels compiled, workspaces sized)
    clear()
    settle(device)
    with MemoryMeter(device) as meter:
        meter.mark("forward")
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(hidden, weight, target)
        meter.mark("backward")
        loss.backward()
    grads = (loss.detach().float(), hidden.grad.float(), weight.grad.float())
    times = time_calls(step, repeats, device=device, before=clear)
    return {"forward_bytes": meter.record.extra("forward"), "backward_bytes": meter.record.extra("backward"),
            "step_ms_median": statistics.median(times), "step_ms": times, "memory_source": meter.record.source,
            "_grads": grads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dry = os.environ.get("DRY") == "1"
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print("error: no CUDA device is visible (DRY=1 runs the script on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    save_environment(args.out, collect_environment())
    dist.init_process_group("gloo" if dry else "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    rows_path = args.out / "vocab_parallel_world1.jsonl"
    failed = 0
    try:
        for n, h, v in DRY_SHAPES if dry else GPU_SHAPES:
            try:
                plain = _measure(lambda a, b, c: fusedce.linear_cross_entropy(a, b, c), n, h, v, device,
                                 args.repeats)
                parallel = _measure(lambda a, b, c: fusedce.vocab_parallel_linear_cross_entropy(a, b, c, vocab_size=v),
                                    n, h, v, device, args.repeats)
                differences = {name: relative_error(x, y) for name, x, y in
                               zip(("loss", "grad_hidden", "grad_weight"), parallel.pop("_grads"),
                                   plain.pop("_grads"))}
                kwargs = dict(hidden_dtype=torch.bfloat16, weight_dtype=torch.float32, compute_dtype=torch.bfloat16,
                              impl="torch" if dry else "triton")
                predicted = {"plain": predict_peak_bytes(n, h, v, **kwargs),
                             "vocab-parallel": predict_vocab_parallel_peak_bytes(n, h, v, 1, **kwargs)}
                with rows_path.open("a") as fh:
                    for name, row in (("plain", plain), ("vocab-parallel", parallel)):
                        p = predicted[name]
                        fh.write(json.dumps({"loss": name, "tokens": n, "hidden": h, "vocab": v, **row,
                                             "predicted_forward_bytes": p.forward,
                                             "predicted_backward_bytes": p.backward,
                                             "relative_difference": differences, "dry": dry}) + "\n")
                print(f"N={n} H={h} V={v}: plain fwd {plain['forward_bytes']} bwd {plain['backward_bytes']} B "
                      f"{plain['step_ms_median']:.2f} ms | vocab-parallel fwd {parallel['forward_bytes']} "
                      f"bwd {parallel['backward_bytes']} B {parallel['step_ms_median']:.2f} ms | "
                      f"differences {differences}", flush=True)
            except Exception:  # keep the other shapes
                failed += 1
                traceback.print_exc()
                with rows_path.open("a") as fh:
                    fh.write(json.dumps({"tokens": n, "hidden": h, "vocab": v, "error": traceback.format_exc(),
                                         "dry": dry}) + "\n")
                if device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
