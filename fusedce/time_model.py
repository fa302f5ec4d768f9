"""A coarse model of one forward+backward's time, for the planner to compare its own plans.

It answers "how much slower is this plan than that one" for plans of the same loss, not
"how long will the step take": :func:`fusedce.planner.plan_chunks` uses it to keep the
``"min"`` budget within :data:`fusedce.planner.MIN_PLANNED_TIME_FACTOR` of the default's time.

The host issues launches asynchronously and runs ahead of the GPU, so a step takes the
larger of two sums, plus a fixed cost:

- **device**: each block's GEMM FLOPs at :data:`GEMM_FLOPS_PER_S` plus the bytes its row
  kernels and conversions move at :data:`HBM_BYTES_PER_S`;
- **host**: :data:`HOST_S_PER_BLOCK_PASS` per block and pass, the Python, dispatcher and
  launch cost of one block (a few products, one or two Triton launches, the slicing around them).

Per block of R rows × C columns (H the hidden size, c bytes of the compute dtype):

    recompute  forward   2·R·C·H FLOPs; 8·R·C bytes (fp32 logits written, read)
                         + 6·C·H bytes when an fp32 weight chunk is converted (read 4, write 2)
               backward  6·R·C·H FLOPs; 14·R·C bytes (written 4, read 4, gradient written 2,
                         read by two products 2 + 2) + the same conversion
    kept       a recompute plan's columns [0, K) whose bf16 logits the forward keeps
               (``plan.kept_cols``): 6·R·C·H FLOPs; 12·R·C bytes (written 2, read 2 in forward;
               read 2, gradient written 2, read by two products 2 + 2 in backward)
    split      a recompute plan whose backward runs in two passes (``plan.hidden_rows``): the
               blocks above without the grad_hidden product (6·R·C·H FLOPs), then the grad_hidden
               pass's blocks: 4·R·C·H FLOPs, 14·R·C bytes, one host pass each
    precompute one pass per row chunk of R × V: 6·R·V·H FLOPs, 14·R·V bytes, and the
               grad_weight sum read and written (V·H·8 bytes in fp32, V·H·2c rounded per chunk);
               host cost of two block passes

The constants are an H200's (``benchmarks/NOTES.md``): cuBLAS bf16 products at ~650
TFLOP/s on these shapes, ~4 TB/s of achieved memory bandwidth, and ~160 µs of host time per
block and pass. The host term is what makes many small blocks slow (at 8192×768×32777 in amp,
264 blocks of 1157 × 1024 ran 86.5 ms against the default's 14 blocks' 8.8 ms) while large
blocks hide it (202 blocks of 4398 × 1280 at 8192×4096×128256 ran 1.18 × the default's 30).
It under-predicts the small heads by up to ~25 % (20 blocks of 8192 × 1664 at H = 768 ran
10.2 ms, modelled 7.4): :data:`fusedce.planner.MIN_PLANNED_TIME_FACTOR` leaves that margin.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planner imports this module
    from fusedce.planner import ChunkPlan

GEMM_FLOPS_PER_S = 650e12
HBM_BYTES_PER_S = 4.0e12
HOST_S_PER_BLOCK_PASS = 160e-6
FIXED_S = 1.0e-3  # the per-token statistics, the loss and the allocations of one step


def step_seconds(n: int, h: int, v: int, plan: "ChunkPlan", *, convert_weight: bool, compute_bytes: int = 2) -> float:
    """Modelled seconds of one forward+backward of an (N, H) × (V, H) loss walked with ``plan``.

    ``convert_weight``: the weight is converted to the compute dtype chunk by chunk (an fp32
    master weight under autocast); ``compute_bytes``: bytes of the compute dtype.
    """
    n, v = max(n, 1), max(v, 1)
    device = host = 0.0
    if plan.strategy == "precompute":
        weight_sum = v * h * (8 if not plan.per_chunk else 2 * compute_bytes)
        for rows, count in _chunk_sizes(n, plan.rows):
            device += count * (6 * rows * v * h / GEMM_FLOPS_PER_S + (14 * rows * v + weight_sum) / HBM_BYTES_PER_S)
            host += count * 2 * HOST_S_PER_BLOCK_PASS
        if convert_weight:
            device += 6 * v * h / HBM_BYTES_PER_S  # one bf16 copy of the fp32 weight
        return FIXED_S + max(device, host)
    split = plan.hidden_rows > 0  # the backward's grad_hidden pass has blocks of its own
    kept = min(plan.kept_cols, v)
    device, host = _block_seconds(n, h, v - kept, plan.rows, plan.cols, flops=6 if split else 8, traffic=22,
                                  passes=2, convert_weight=convert_weight)
    if kept:
        kept_device, kept_host = _block_seconds(n, h, kept, plan.rows, plan.cols, flops=6, traffic=12, passes=2,
                                                convert_weight=convert_weight)
        device, host = device + kept_device, host + kept_host
    if split:
        hidden_device, hidden_host = _block_seconds(n, h, v, plan.hidden_rows, plan.hidden_cols, flops=4, traffic=14,
                                                    passes=1, convert_weight=convert_weight)
        device, host = device + hidden_device, host + hidden_host
    return FIXED_S + max(device, host)


def _block_seconds(n: int, h: int, v: int, row_step: int, col_step: int, *, flops: int, traffic: int, passes: int,
                   convert_weight: bool) -> tuple[float, float]:
    """(device, host) seconds of the ``row_step`` × ``col_step`` blocks of an (N, V) walk, each taking
    ``flops``·R·C·H FLOPs, ``traffic``·R·C bytes, and ``passes`` host passes (each converting the fp32
    weight chunk, 6·C·H bytes, when ``convert_weight``)."""
    device = host = 0.0
    for rows, row_count in _chunk_sizes(n, row_step):
        for cols, col_count in _chunk_sizes(v, col_step):
            blocks = row_count * col_count
            conversion = passes * 6 * cols * h if convert_weight else 0
            device += blocks * (flops * rows * cols * h / GEMM_FLOPS_PER_S
                                + (traffic * rows * cols + conversion) / HBM_BYTES_PER_S)
            host += blocks * passes * HOST_S_PER_BLOCK_PASS
    return device, host


def _chunk_sizes(total: int, step: int) -> list[tuple[int, int]]:
    """(size, count) of the chunks ``range(0, total, step)`` makes: the full ones and the last (none of 0)."""
    if total <= 0:
        return []
    step = max(1, min(step, total))
    full, last = divmod(total, step)
    return [(step, full)] + ([(last, 1)] if last else [])
