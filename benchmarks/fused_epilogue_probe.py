"""Does a logits GEMM with the softmax math in its epilogue beat cuBLAS + a separate block pass?

An experiment, not part of the loss. fusedce's passes compute each ``R × C`` block of raw logits
with cuBLAS into an fp32 buffer and then run a Triton kernel over that buffer (forward: the
block's log-sum-exp statistics; backward: the logit gradients, written back as bf16). The
fp32 block is written once and read once per pass (8 bytes per logit, ~1.9 ms per pass at
8192 × 128256 on an H200) and is the largest temporary of the default plan. Here one Triton
kernel multiplies a tile and finishes the softmax math on it in registers:

- forward, ``EPILOGUE=0``: per (row, column tile) the tile's max and Σexp, merged over the
  tiles afterwards in a fixed order (bitwise reproducible), and the target's logit;
- backward, ``EPILOGUE=1``: d = scale · (exp(x − lse) − [v = y]) stored as bf16, which cuBLAS
  then multiplies for grad_hidden and grad_weight.

Plain bf16 inputs, no bias, soft-cap, label smoothing or z-loss (the probe's scope). Run on
the device::

    python3 benchmarks/fused_epilogue_probe.py --out $OUT [--heads 8192x768x32777 ...]

It checks the fused results against an fp32 reference and fusedce's own passes, and times,
per head, (a) fusedce's forward and backward passes with the library's default plan, (b) the
same loops with the fused kernels, (c) the fused forward over the whole vocabulary at once
(no fp32 block: one launch). Writes ``fused-epilogue.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [
    triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_stages=s, num_warps=w)
    for bm, bn, bk, s, w in [
        (128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 3, 4), (64, 256, 64, 4, 4),
        (128, 256, 64, 4, 8), (256, 128, 64, 3, 8),
    ]
]


@triton.jit
def _swizzle(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile, GROUP_M row tiles at a time (each weight tile is reused from L2)."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size_m, (tile % group) // size_m


@triton.jit
def _epilogue(acc, pid_m, pid_n, M, N, target_ptr, col0, lse_ptr, scale_ptr,
              part_max_ptr, part_sum_ptr, part_stride, target_logit_ptr, d_ptr, stride_dm,
              EPILOGUE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The softmax math on one (BM, BN) fp32 tile of raw logits (see the kernels)."""
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    row_ok = rows < M
    col_ok = cols < N
    local_target = tl.load(target_ptr + rows, mask=row_ok, other=-1) - col0
    hit = cols[None, :] == local_target[:, None]
    if EPILOGUE == 0:
        x = tl.where(col_ok[None, :], acc, float("-inf"))
        m = tl.max(x, axis=1)
        s = tl.sum(tl.exp(x - m[:, None]), axis=1)
        tl.store(part_max_ptr + rows.to(tl.int64) * part_stride + pid_n, m, mask=row_ok)
        tl.store(part_sum_ptr + rows.to(tl.int64) * part_stride + pid_n, s, mask=row_ok)
        in_tile = row_ok & (local_target >= pid_n * BN) & (local_target < pid_n * BN + BN) & (local_target < N)
        tl.store(target_logit_ptr + rows, tl.sum(tl.where(hit, acc, 0.0), axis=1), mask=in_tile)
    else:
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
        grad = (tl.exp(acc - lse[:, None]) - tl.where(hit, 1.0, 0.0)) * scale[:, None]
        d_ptrs = d_ptr + rows.to(tl.int64)[:, None] * stride_dm + cols[None, :]
        tl.store(d_ptrs, grad.to(d_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.autotune(CONFIGS, key=["M", "N", "K", "EPILOGUE"])
@triton.jit
def logits_epilogue_kernel(
    a_ptr, b_ptr, M, N, K, stride_am, stride_bn,
    target_ptr, col0, lse_ptr, scale_ptr,
    part_max_ptr, part_sum_ptr, part_stride, target_logit_ptr,
    d_ptr, stride_dm,
    EPILOGUE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    """x = a @ bᵀ for one (BM, BN) tile; a (M, K) bf16 rows, b (N, K) bf16 rows (unit K stride),
    loaded through pointers (Triton pipelines them with asynchronous copies).

    EPILOGUE 0: part_max[m, tile], part_sum[m, tile] = the tile's max and Σ exp(x − max);
    target_logit[m] = x[m, y_m − col0] by the one tile that holds the target column.
    EPILOGUE 1: d[m, n] = scale_m · (exp(x − lse_m) − [n = y_m − col0]) in d's dtype.
    """
    pid_m, pid_n = _swizzle(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + cols.to(tl.int64)[None, :] * stride_bn + ks[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + ks) < K
        a = tl.load(a_ptrs, mask=(rows < M)[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=(cols < N)[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    _epilogue(acc, pid_m, pid_n, M, N, target_ptr, col0, lse_ptr, scale_ptr, part_max_ptr, part_sum_ptr,
              part_stride, target_logit_ptr, d_ptr, stride_dm, EPILOGUE, BM, BN)


@triton.autotune(CONFIGS, key=["M", "N", "K", "EPILOGUE", "NUM_PROGRAMS"])
@triton.jit
def logits_epilogue_tma_kernel(
    a_ptr, b_ptr, M, N, K, stride_am, stride_bn,
    target_ptr, col0, lse_ptr, scale_ptr,
    part_max_ptr, part_sum_ptr, part_stride, target_logit_ptr,
    d_ptr, stride_dm, NUM_PROGRAMS,
    EPILOGUE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    """The same tile through Hopper's tensor-memory descriptors (TMA loads, out-of-range rows and
    columns zero-filled by the copy engine). ``NUM_PROGRAMS``: 0 for one program per tile, else
    that many persistent programs striding over the tiles."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BN, BK])
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    if NUM_PROGRAMS == 0:
        first, step = tl.program_id(0), num_m * num_n
    else:
        first, step = tl.program_id(0), NUM_PROGRAMS
    for tile in tl.range(first, num_m * num_n, step, flatten=True):
        pid_m, pid_n = _swizzle(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k0])
            b = b_desc.load([pid_n * BN, k0])
            acc = tl.dot(a, b.T, acc)
        _epilogue(acc, pid_m, pid_n, M, N, target_ptr, col0, lse_ptr, scale_ptr, part_max_ptr, part_sum_ptr,
                  part_stride, target_logit_ptr, d_ptr, stride_dm, EPILOGUE, BM, BN)


@triton.jit
def merge_partials_kernel(part_max_ptr, part_sum_ptr, part_stride, n_tiles, max_ptr, sumexp_ptr,
                          target_logit_ptr, block_target_ptr, BLOCK: tl.constexpr):
    """One program per row: fold the row's tile statistics, in tile order, into its running
    (max, sumexp) and add the block's target logit."""
    row = tl.program_id(0).to(tl.int64)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    for start in range(0, n_tiles, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n_tiles
        pm = tl.load(part_max_ptr + row * part_stride + offs, mask=ok, other=float("-inf"))
        ps = tl.load(part_sum_ptr + row * part_stride + offs, mask=ok, other=0.0)
        m_new = tl.maximum(m, tl.max(pm, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.where(ok, ps * tl.exp(pm - m_new), 0.0), axis=0)
        m = m_new
    m_old = tl.load(max_ptr + row)
    s_old = tl.load(sumexp_ptr + row)
    m_all = tl.maximum(m_old, m)
    tl.store(sumexp_ptr + row, s_old * tl.exp(m_old - m_all) + s * tl.exp(m - m_all))
    tl.store(max_ptr + row, m_all)
    tl.store(target_logit_ptr + row, tl.load(target_logit_ptr + row) + tl.load(block_target_ptr + row))


VARIANTS = ("pointer", "tma", "tma_persistent")


def _launch(variant: str, m: int, n: int, args: tuple, epilogue: int) -> int:
    """Run one fused tile kernel over an (m, n) block; returns the tile width BN it chose."""
    if variant == "pointer":
        kernel = logits_epilogue_kernel
        kernel[lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)](*args, EPILOGUE=epilogue)
    else:
        kernel = logits_epilogue_tma_kernel
        sms = torch.cuda.get_device_properties(0).multi_processor_count if variant == "tma_persistent" else 0

        def grid(meta):
            tiles = triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"])
            return (min(tiles, sms) if sms else tiles,)

        kernel[grid](*args, sms, EPILOGUE=epilogue)
    return kernel.best_config.kwargs["BN"]


def fused_block_stats(variant, h, w_blk, target, col0, stats, part):
    """Fold the block ``h @ w_blkᵀ`` into ``stats`` (fusedce.stats.RowStats, fp32) without an
    fp32 block. ``part``: scratch (R, ≥ ⌈C/64⌉) fp32 twice and (R,) fp32 for the block's target logit."""
    m, k = h.shape
    n = w_blk.shape[0]
    part_max, part_sum, block_target = part
    block_target.zero_()
    bn = _launch(variant, m, n, (h, w_blk, m, n, k, h.stride(0), w_blk.stride(0), target, col0, h, h,
                                 part_max, part_sum, part_max.stride(0), block_target, h, 0), 0)
    merge_partials_kernel[(m,)](part_max, part_sum, part_max.stride(0), triton.cdiv(n, bn), stats.max,
                                stats.sumexp, stats.target_logit, block_target, BLOCK=256)


def fused_block_grad(variant, h, w_blk, target, col0, lse, scale, d):
    """d (R, C) bf16 = scale · (softmax − onehot) of the block ``h @ w_blkᵀ``."""
    m, k = h.shape
    n = w_blk.shape[0]
    _launch(variant, m, n, (h, w_blk, m, n, k, h.stride(0), w_blk.stride(0), target, col0, lse, scale,
                            h, h, 0, h, d, d.stride(0)), 1)


def timed(fn, repeats: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def run_head(n: int, h: int, v: int, repeats: int) -> dict:
    from fusedce import kernels as block_math
    from fusedce import passes
    from fusedce.options import LossOptions
    from fusedce.planner import plan_chunks
    from fusedce.stats import RowStats

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(n, h, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    weight = (torch.randn(v, h, device="cuda", generator=gen) / h ** 0.5).to(torch.bfloat16)
    target = torch.randint(0, v, (n,), device="cuda", generator=gen)
    target[::7] = -100
    opts = LossOptions()
    plan = plan_chunks(n, h, v, hidden_dtype=torch.bfloat16, weight_dtype=torch.bfloat16,
                       compute_dtype=torch.bfloat16, strategy="recompute", scalar_loss=False,
                       needs_grad=True, cuda=True)
    row_chunks, col_chunks = plan.row_chunks(n), plan.col_chunks(v)
    result = {"head": f"{n}x{h}x{v}", "plan_rows": plan.rows, "plan_cols": plan.cols,
              "blocks": len(row_chunks) * len(col_chunks)}

    # --- forward: fusedce's passes against the fused kernel, block by block and all at once.
    def lib_forward():
        return passes.forward(hidden, weight, target, None, opts, torch.bfloat16, plan, block_math)

    part_cols = triton.cdiv(max(c1 - c0 for c0, c1 in col_chunks), 64)
    part_whole = triton.cdiv(v, 64)

    def fused_forward(variant: str, whole: bool):
        stats = RowStats.empty(n, hidden.device, torch.float32)
        chunks = [(0, v)] if whole else col_chunks
        width = part_whole if whole else part_cols
        part = (torch.empty(n, width, device="cuda"), torch.empty(n, width, device="cuda"),
                torch.empty(n, device="cuda"))
        for c0, c1 in chunks:
            fused_block_stats(variant, hidden, weight[c0:c1], target, c0, stats, part)
        return stats

    _, lse_lib = lib_forward()
    ref = torch.logsumexp(hidden.float() @ weight.float().T, dim=1)
    ok = target != -100
    tgt_ref = (hidden.float()[ok] * weight.float()[target[ok]]).sum(1)
    result["fwd_lib_lse_err_vs_fp32"] = (lse_lib - ref).abs().max().item()
    result["fwd_lib_ms"] = timed(lib_forward, repeats)
    for variant in VARIANTS:
        for whole in (False, True):
            name = f"fwd_{variant}_{'whole' if whole else 'blocks'}"
            try:
                stats = fused_forward(variant, whole)
            except Exception as error:  # a variant this Triton cannot compile: recorded, not fatal
                result[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
                continue
            result[f"{name}_lse_err_vs_fp32"] = (stats.logsumexp() - ref).abs().max().item()
            result[f"{name}_target_err_vs_fp32"] = (stats.target_logit[ok] - tgt_ref).abs().max().item()
            result[f"{name}_ms"] = timed(lambda: fused_forward(variant, whole), repeats)
        kernel = logits_epilogue_kernel if variant == "pointer" else logits_epilogue_tma_kernel
        result[f"fwd_{variant}_config"] = str(kernel.best_config)
    del ref

    # --- backward of the per-token loss with upstream gradient 1 (non-ignored tokens).
    row_scale = (target != -100).float()
    grad_out = row_scale.clone()

    def lib_backward():
        return passes.backward(grad_out, hidden, weight, target, None, lse_lib, opts, torch.bfloat16, plan,
                               block_math, need_bias=False)

    def fused_backward(variant: str):
        grad_h = torch.zeros(n, h, device="cuda", dtype=torch.float32)
        grad_w = torch.empty_like(weight)
        width = max(c1 - c0 for c0, c1 in col_chunks)
        d_buf = torch.empty(n * width, device="cuda", dtype=torch.bfloat16)
        for c0, c1 in col_chunks:
            w_j = weight[c0:c1]
            d = d_buf[: n * (c1 - c0)].view(n, c1 - c0)
            fused_block_grad(variant, hidden, w_j, target, c0, lse_lib, row_scale, d)
            torch.addmm(grad_h, d, w_j, out_dtype=torch.float32, out=grad_h)
            torch.mm(d.T, hidden, out=grad_w[c0:c1])
        return grad_h.to(torch.bfloat16), grad_w

    lib_h, lib_w = lib_backward()[:2]
    result["bwd_lib_ms"] = timed(lib_backward, repeats)
    for variant in VARIANTS:
        try:
            gh, gw = fused_backward(variant)
        except Exception as error:
            result[f"bwd_{variant}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        result[f"bwd_{variant}_grad_h_rel_diff_vs_lib"] = ((gh.float() - lib_h.float()).norm() / lib_h.float().norm()).item()
        result[f"bwd_{variant}_grad_w_rel_diff_vs_lib"] = ((gw.float() - lib_w.float()).norm() / lib_w.float().norm()).item()
        result[f"bwd_{variant}_ms"] = timed(lambda: fused_backward(variant), repeats)
    for key in [k for k in result if k.endswith("_ms")]:
        result[key.replace("_ms", "_median_ms")] = statistics.median(result[key])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heads", nargs="*", default=["8192x768x32777", "8192x2304x256000", "8192x4096x128256"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    results = []
    for head in args.heads:
        n, h, v = (int(x) for x in head.split("x"))
        row = run_head(n, h, v, args.repeats)
        results.append(row)
        print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x) for k, x in row.items()
                          if not isinstance(x, list)}), flush=True)
        torch.cuda.empty_cache()
    from fusedce_profiler.instrument.environment import collect_environment
    (args.out / "fused-epilogue.json").write_text(json.dumps({"environment": collect_environment(),
                                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
