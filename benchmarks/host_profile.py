"""Where a host-bound step's host time goes: fusedce's loss at small heads, profiled in Python.

At the user's head (8192×768×32777) under autocast the default step's kernels take less time
than the step: the host issues each block's products and kernels more slowly than the GPU runs
them. Per case this records the step's CUDA-event time (median of ``--repeats``), the host time
to issue one step (``perf_counter`` around forward + backward, no synchronisation inside), the
plan's block count, the calls a step makes by function (``cProfile`` over ``--profiled`` steps:
own time and calls per step, the top ``--top``), and, for scale, the host time of launching one
tiny Triton kernel and one tiny torch op.

    python3 benchmarks/host_profile.py --out $OUT/host-profile.json      (on the device)
    python3 benchmarks/host_profile.py --out … --cases 8192x768x32777:bf16:default 8192x768x32777:bf16:fast
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fusedce  # noqa: E402
from fusedce.memory_model import predict_peak_bytes  # noqa: E402
from benchmarks.protocol import parse_row  # noqa: E402
from benchmarks.tiles_ab import save_with_environment  # noqa: E402

CASES = (("8192x768x32777", "amp", "default"), ("8192x768x32777", "amp", "min"),
         ("8192x768x32777", "bf16", "default"), ("8192x3072x32064", "amp", "default"))


def make_inputs(head: str, mode: str):
    n, h, v = (int(x) for x in head.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight_dtype = torch.float32 if mode == "amp" else torch.bfloat16
    hidden = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    weight = (torch.randn(v, h, device="cuda", generator=gen) * h ** -0.5).to(weight_dtype).requires_grad_()
    target = torch.randint(0, v, (n,), device="cuda", generator=gen)
    return hidden, weight, target


def step_fn(hidden, weight, target, mode: str, budget: str):
    kwargs = {} if budget == "default" else {"memory_budget": budget}

    def run():
        hidden.grad = weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "amp"):
            loss = fusedce.linear_cross_entropy(hidden, weight, target, **kwargs)
        loss.backward()
    return run


def launch_us(fn, launches: int = 2000) -> float:
    """Mean host microseconds per call of ``fn`` over ``launches`` calls, after one
    call that compiles and loads it (not counted)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        fn()
    elapsed = (time.perf_counter() - start) / launches * 1e6
    torch.cuda.synchronize()
    return elapsed


def tiny_triton():
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1.0)

    x = torch.zeros(1, device="cuda")
    return lambda: _add_one[(1,)](x)


def profile_case(head, mode, budget, repeats, profiled, top):
    hidden, weight, target = make_inputs(head, mode)
    run = step_fn(hidden, weight, target, mode, budget)
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        run()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(profiled):
        run()
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (calls, _, own, cumulative, _) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}:{name}", "calls_per_step": calls / profiled,
                     "own_ms_per_step": own * 1e3 / profiled, "cumulative_ms_per_step": cumulative * 1e3 / profiled})
    rows.sort(key=lambda r: -r["own_ms_per_step"])
    by_cumulative = sorted(rows, key=lambda r: -r["cumulative_ms_per_step"])[:top]
    n, h, v = (int(x) for x in head.split("x"))
    plan = predict_peak_bytes(n, h, v, hidden_dtype=hidden.dtype, weight_dtype=weight.dtype,
                              compute_dtype=torch.bfloat16, memory_budget=None if budget == "default" else budget).plan
    return {"head": head, "mode": mode, "budget": budget, "plan": repr(plan), "step_ms": statistics.median(times),
            "step_ms_all": times, "host_issue_ms": statistics.median(host), "host_issue_ms_all": host,
            "top_own": rows[:top], "top_cumulative": by_cumulative}


def case_of(text: str) -> tuple[str, str, str]:
    """``N×H×V:MODE:BUDGET`` (``8192x768x32777:bf16:fast``) as (head, mode, budget), the head written
    ``NxHxV``; argparse names a bad one."""
    head, _, rest = text.partition(":")
    mode, _, budget = rest.partition(":")
    try:
        row = parse_row(head)
    except ValueError:
        row = None
    if row is None or min(row.tokens, row.hidden, row.vocab) <= 0 or mode not in ("amp", "bf16") \
            or budget not in ("default", "fast", "min"):
        raise argparse.ArgumentTypeError(f"expected N×H×V:MODE:BUDGET such as 8192x768x32777:bf16:fast (MODE amp "
                                         f"or bf16, BUDGET default, fast or min), got {text!r}")
    return f"{row.tokens}x{row.hidden}x{row.vocab}", mode, budget


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--profiled", type=int, default=5)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--cases", nargs="+", metavar="HEAD:MODE:BUDGET", type=case_of, default=CASES,
                        help="e.g. 8192x768x32777:bf16:fast (default: the four of CASES)")
    args = parser.parse_args()
    x = torch.zeros(1, device="cuda")
    rows = [{"tiny_torch_op_us": launch_us(lambda: x.add_(1.0)), "tiny_triton_launch_us": launch_us(tiny_triton())}]
    print(rows[0], flush=True)
    for head, mode, budget in args.cases:
        row = profile_case(head, mode, budget, args.repeats, args.profiled, args.top)
        rows.append(row)
        print(f"{head} {mode} {budget}: step {row['step_ms']:.2f} ms, host issue {row['host_issue_ms']:.2f} ms, "
              f"{row['plan']}", flush=True)
        for r in row["top_own"][:15]:
            print(f"   {r['own_ms_per_step']:7.3f} ms own  {r['calls_per_step']:7.1f} calls  {r['function']}")
        torch.cuda.empty_cache()
    save_with_environment(args.out, rows)


if __name__ == "__main__":
    main()
