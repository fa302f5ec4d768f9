"""Quick GPU check of the fusedce kernels: correctness, determinism, memory and time.

One call on the device machine, before the full benchmark: checks every option against an
fp32 reference at a realistic shape, bitwise determinism, N·V > 2³¹, torch.compile, and
times fusedce against eager torch and torch.compile on the ANCHORS rows (amp and bf16).

    python3 benchmarks/gpu_smoke.py --out $OUT
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fusedce  # noqa: E402
from fusedce import matmul  # noqa: E402
from fusedce.options import LossOptions  # noqa: E402
from fusedce_profiler.instrument.backends import torch_loss  # noqa: E402
from fusedce_profiler.instrument.protocol import MemoryMeter, settle, synchronize, time_calls  # noqa: E402
from fusedce_profiler.instrument.reference import reference as fp32_reference  # noqa: E402
from fusedce_profiler.instrument.reference import relative_error  # noqa: E402

GiB = 1 << 30


def reference(h, w, y, b=None, *, eps=0.0, zl=0.0, sc=None, chunk=2048):
    """fp32 chunked reference (:func:`fusedce_profiler.instrument.reference.reference`): (loss, grad_h, grad_w, grad_b)."""
    ref = fp32_reference(h, w, y, b, LossOptions(label_smoothing=eps, z_loss=zl, softcap=sc), chunk=chunk)
    return ref.loss.item(), ref.grad_hidden, ref.grad_weight, ref.grad_bias


def rel(a, b):
    """The project's relative error (:func:`fusedce_profiler.instrument.reference.relative_error`)."""
    return relative_error(a, b)


def run_loss(fn, h, w, y, b=None, amp=False, **kw):
    h = h.detach().requires_grad_()
    w = w.detach().requires_grad_()
    b = b.detach().requires_grad_() if b is not None else None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        loss = fn(h, w, y, b, **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad, (b.grad if b is not None else None)


def fused(h, w, y, b, **kw):
    return fusedce.linear_cross_entropy(h, w, y, b, **kw)


def eager(h, w, y, b, label_smoothing=0.0, z_loss=0.0, softcap=None):
    """The eager torch loss as users write it (:func:`fusedce_profiler.instrument.backends.torch_loss`)."""
    return torch_loss(h, w, y, b, LossOptions(label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap))


def check_options(log):
    n, hdim, v = 4096, 768, 32777
    g = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(n, hdim, device="cuda", generator=g).bfloat16()
    w = (torch.randn(v, hdim, device="cuda", generator=g) / hdim ** 0.5 * 2)
    b = torch.randn(v, device="cuda", generator=g) * 0.1
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[torch.rand(n, device="cuda", generator=g) < 0.3] = -100
    cases = [dict(), dict(label_smoothing=0.1), dict(z_loss=1e-4), dict(softcap=30.0),
             dict(label_smoothing=0.1, z_loss=1e-4, softcap=30.0)]
    for mode in ("amp", "bf16", "fp32", "fp16"):
        for kw in cases:
            for bias in (None, b):
                wm = {"amp": w, "bf16": w.bfloat16(), "fp32": w, "fp16": w.half()}[mode]
                hm = {"amp": h, "bf16": h, "fp32": h.float(), "fp16": h.half()}[mode]
                bm = None if bias is None else bias.to(wm.dtype)
                ref = reference(hm, wm, y, bm, eps=kw.get("label_smoothing", 0.0), zl=kw.get("z_loss", 0.0),
                                sc=kw.get("softcap"))
                out = run_loss(fused, hm, wm, y, bm, amp=mode == "amp", **kw)
                base = run_loss(eager, hm, wm, y, bm, amp=mode == "amp", **kw)
                row = {"mode": mode, "opts": kw, "bias": bias is not None,
                       "fused": [abs(out[0].item() - ref[0]) / abs(ref[0]), rel(out[1], ref[1]), rel(out[2], ref[2])]
                       + ([rel(out[3], ref[3])] if bias is not None else []),
                       "eager": [abs(base[0].item() - ref[0]) / abs(ref[0]), rel(base[1], ref[1]), rel(base[2], ref[2])]
                       + ([rel(base[3], ref[3])] if bias is not None else []),
                       "dtypes": [str(out[1].dtype), str(out[2].dtype)]}
                log(row)


def check_hidden_fp32_amp(log):
    n, hdim, v = 2048, 1024, 50257
    h = torch.randn(n, hdim, device="cuda")
    w = torch.randn(v, hdim, device="cuda") / hdim ** 0.5
    y = torch.randint(0, v, (n,), device="cuda")
    ref = reference(h, w, y)
    out = run_loss(fused, h, w, y, amp=True)
    log({"check": "amp fp32 hidden", "dtypes": [str(out[1].dtype), str(out[2].dtype)],
         "err": [abs(out[0].item() - ref[0]) / ref[0], rel(out[1], ref[1]), rel(out[2], ref[2])]})


def check_determinism(log):
    n, hdim, v = 8192, 768, 32777
    h = torch.randn(n, hdim, device="cuda").bfloat16()
    w = torch.randn(v, hdim, device="cuda") / hdim ** 0.5
    y = torch.randint(0, v, (n,), device="cuda")
    a = run_loss(fused, h, w, y, amp=True)
    same = True
    for _ in range(3):
        c = run_loss(fused, h, w, y, amp=True)
        same &= all(torch.equal(p, q) for p, q in zip(a[:3], c[:3]))
    log({"check": "determinism", "bitwise_equal": bool(same)})


def check_large(log):
    n, hdim, v = 8192, 64, 262144
    h = torch.randn(n, hdim, device="cuda").bfloat16()
    w = (torch.randn(v, hdim, device="cuda") / hdim ** 0.5 * 3).bfloat16()
    y = torch.randint(0, v, (n,), device="cuda")
    ref = reference(h, w, y, chunk=1024)
    out = run_loss(fused, h, w, y)
    log({"check": "N*V > 2^31", "nv": n * v, "err": [abs(out[0].item() - ref[0]) / ref[0], rel(out[1], ref[1]),
                                                      rel(out[2], ref[2])]})


def check_compile(log):
    n, hdim, v = 1024, 256, 5003
    h = torch.randn(n, hdim, device="cuda")
    w = torch.randn(v, hdim, device="cuda") / 16
    y = torch.randint(0, v, (n,), device="cuda")

    def step(h, w, y):
        return fusedce.linear_cross_entropy(h * 2.0, w, y, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True)
    e = run_loss(lambda h, w, y, b: step(h, w, y), h, w, y, amp=True)
    c = run_loss(lambda h, w, y, b: compiled(h, w, y), h, w, y, amp=True)
    log({"check": "torch.compile", "equal": [torch.equal(p, q) for p, q in zip(e[:3], c[:3])],
         "err": [rel(p, q) for p, q in zip(e[:3], c[:3])]})


def measure(fn, h, w, y, amp, repeats=5):
    """Peak extra and median time of one forward+backward, by the project's protocol
    (:mod:`fusedce_profiler.instrument.protocol`: warm-up, settle, metered step, CUDA-event timings)."""
    leaf = {}

    def once():
        leaf["h"] = h.detach().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = fn(leaf["h"], w, y, None)
        loss.backward()

    def clear():
        leaf.clear()
        w.grad = None

    once()
    clear()
    settle("cuda")
    with MemoryMeter("cuda") as meter:
        meter.mark("step")
        once()
        synchronize("cuda")
    clear()
    times = time_calls(once, repeats, device="cuda", before=clear)
    clear()
    return meter.record.extra(), statistics.median(times)


def time_rows(log, rows):
    compiled = torch.compile(eager)
    for n, hdim, v in rows:
        for mode in ("amp", "bf16"):
            torch.manual_seed(0)
            h = torch.randn(n, hdim, device="cuda").bfloat16()
            w = (torch.randn(v, hdim, device="cuda") / hdim ** 0.5).to(torch.float32 if mode == "amp" else torch.bfloat16)
            w.requires_grad_()
            y = torch.randint(0, v, (n,), device="cuda")
            floor = n * hdim * 2 + v * hdim * w.element_size()
            for name, fn in (("fusedce", fused), ("torch", eager), ("torch_compile", compiled)):
                try:
                    peak, ms = measure(fn, h, w, y, mode == "amp")
                    log({"row": f"{n}x{hdim}x{v}", "mode": mode, "impl": name, "peak_GiB": peak / GiB,
                         "x_floor": peak / floor, "ms": ms, "tflops": 6 * n * hdim * v / ms / 1e9})
                except torch.OutOfMemoryError as exc:
                    log({"row": f"{n}x{hdim}x{v}", "mode": mode, "impl": name, "oom": str(exc)[:200]})
                gc.collect()
                torch.cuda.empty_cache()
            del h, w, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    out = Path(args.out) / "gpu_smoke.jsonl"
    f = out.open("w")

    def log(row):
        print(json.dumps(row), flush=True)
        f.write(json.dumps(row) + "\n")
        f.flush()

    import triton
    log({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
         "out_dtype_mm": matmul.has_out_dtype("cuda", torch.bfloat16)})
    steps = [("options", check_options), ("hidden32", check_hidden_fp32_amp), ("determinism", check_determinism),
             ("large", check_large), ("compile", check_compile),
             ("time", lambda log: time_rows(log, [(8192, 768, 32777), (8192, 2304, 256000), (8192, 4096, 128256),
                                                  (32768, 4096, 128256)]))]
    for name, step in steps:
        if name in args.skip.split(","):
            continue
        t0 = time.time()
        try:
            step(log)
        except Exception as exc:  # keep going: one failing check must not hide the others
            import traceback
            log({"step": name, "error": repr(exc), "tb": traceback.format_exc()[-2000:]})
        log({"step": name, "seconds": time.time() - t0})
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
