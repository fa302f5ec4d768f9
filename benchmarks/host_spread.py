"""Does a slower host explain a host-bound cell's slower day? The user's head under autocast, where
the step is host-bound, measured in rounds, with the host's own speed recorded beside it.

For the frontier's unexplained slowdown (``"min"`` and the amp default at 8192×768×32777 ran
12–28 % slower one morning than the day before, the large heads unmoved) two explanations fit:
(a) that call's machine had a slower host; (b) host-bound cells spread that much between
processes. They predict differently: under (a) every round of one call moves with its host's
speed (the launch latency and the Python loop below), and the two calls differ by as much as
their hosts do; under (b) rounds of one call spread as much as the two calls do, whatever the
host's numbers.

Per round: fusedce's default, ``memory_budget="min"`` and torch.compile of eager (median of
``--repeats`` CUDA-event timings of one forward + backward under bf16 autocast, fp32 weight);
per process: the CPU model, the median host time of launching one tiny kernel (2,000 launches,
no synchronisation between), and of a fixed pure-Python loop.

    python3 benchmarks/host_spread.py --out $OUT/host-spread-K.json --rounds 2   (on the device)
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from benchmarks.tiles_ab import measure, save_with_environment  # noqa: E402

N, H, V = 8192, 768, 32777


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def launch_us(launches: int = 2000, samples: int = 5) -> float:
    """Median host microseconds to launch one tiny kernel (an in-place add on one element)."""
    x = torch.zeros(1, device="cuda")
    results = []
    for _ in range(samples):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            x.add_(1.0)
        results.append((time.perf_counter() - start) / launches * 1e6)
        torch.cuda.synchronize()
    return statistics.median(results)


def python_loop_ms(samples: int = 5) -> float:
    """Median milliseconds of a fixed pure-Python loop: the host's single-thread speed."""
    results = []
    for _ in range(samples):
        start = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        results.append((time.perf_counter() - start) * 1e3)
    return statistics.median(results)


def variants():
    compiled = torch.compile(lambda h, w, t: F.cross_entropy(F.linear(h, w), t))
    return {
        "fusedce": lambda h, w, t: fusedce.linear_cross_entropy(h, w, t),
        "fusedce_min": lambda h, w, t: fusedce.linear_cross_entropy(h, w, t, memory_budget="min"),
        "torch_compile": compiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(N, H, device="cuda", generator=gen, requires_grad=True)
    weight = (torch.randn(V, H, device="cuda", generator=gen) * H ** -0.5).requires_grad_()
    target = torch.randint(0, V, (N,), device="cuda", generator=gen)
    rows = []
    host = {"cpu_model": cpu_model(), "launch_us": launch_us(), "python_loop_ms": python_loop_ms()}
    for round_ in range(args.rounds):
        for name, loss_fn in variants().items():
            def run(loss_fn=loss_fn):
                hidden.grad = weight.grad = None
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(hidden, weight, target)
                loss.backward()
                return loss.detach()
            _, peak, times = measure(run, hidden, weight, args.repeats)
            rows.append({"round": round_, "impl": name, "median_ms": statistics.median(times), "times_ms": times,
                         "peak_extra_bytes": peak, "launch_us": launch_us(), "python_loop_ms": python_loop_ms()})
            print(f"round {round_} {name:14s} {statistics.median(times):8.3f} ms  launch {rows[-1]['launch_us']:.2f} us"
                  f"  loop {rows[-1]['python_loop_ms']:.1f} ms", flush=True)
    save_with_environment(args.out, [{"host": host, "shape": [N, H, V], "mode": "amp"}] + rows)
    print(json.dumps(host))


if __name__ == "__main__":
    main()
