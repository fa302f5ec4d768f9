"""fusedce's forward-phase memory prediction against the CPU allocator's own accounting.

``predict_peak_bytes(...).forward`` is otherwise only ever compared through ``.step``, which
the backward (gradients included) sets. Here the forward phase of ``impl="torch"`` is
measured alone, with the profiler's meter on the CPU (:class:`fusedce_profiler.instrument.protocol.MemoryMeter`:
every allocation and free the CPU allocator reports, summed in time order), and pinned to the
prediction to the byte.

The model counts 8 per-token vectors in forward (statistics, lse, loss and the temporaries
of the loss formula after the block loop). The PyTorch path's forward peak is inside the
loop instead, with the second block-sized temporary exp(c − max) alive; there it holds the
4 (N,) statistics and 3 (R,) row temporaries of ``chunk_stats`` (the block's max, the new
max, the block's Σexp), R the rows of a chunk. So measured = predicted − (4·N − 3·R) ×
the accumulation dtype's bytes, exactly; any other difference is a change in what the
forward allocates or in the formula.
"""
import contextlib

import pytest
import torch

import fusedce
from fusedce.memory_model import predict_peak_bytes
from fusedce_profiler.instrument.protocol import MemoryMeter, settle

F32, BF16 = torch.float32, torch.bfloat16

# mode: (hidden dtype, weight and bias dtype, autocast dtype or None)
MODES = {
    "amp-bf16": (BF16, F32, BF16),  # the profiler's amp mode: bf16 activations, fp32 master weight
    "amp-bf16-fp32-hidden": (F32, F32, BF16),  # a converted hidden chunk too (LayerNorm output under autocast)
    "fp32": (F32, F32, None),
    "bf16": (BF16, BF16, None),
}

# (N, H, V, planner options): one block; several vocabulary chunks with a ragged last one;
# several row chunks (R < N)
SHAPES = {
    "one-block": (512, 32, 3000, {}),
    "vocab-chunks": (256, 64, 5000, {"vocab_chunk_size": 1024}),
    "row-chunks": (300, 40, 2000, {"chunk_size": 64}),
}


def _forward_peak(n, h, v, hidden_dtype, weight_dtype, autocast, bias, options) -> int:
    """Peak bytes over the forward phase, inputs allocated before (as the profiler measures)."""
    gen = torch.Generator().manual_seed(n * h + v)
    hidden = torch.randn(n, h, generator=gen).to(hidden_dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=gen) * h ** -0.5).to(weight_dtype).requires_grad_()
    b = (torch.randn(v, generator=gen) * 0.1).to(weight_dtype).requires_grad_() if bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    target[::7] = fusedce.IGNORE_INDEX
    settle("cpu")
    context = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
    with MemoryMeter("cpu") as meter:
        meter.mark("forward")
        with context:
            loss = fusedce.linear_cross_entropy(hidden, weight, target, b, impl="torch", **options)
    assert torch.isfinite(loss)
    return meter.record.extra("forward")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode", list(MODES))
def test_forward_prediction_is_exact_for_the_torch_path(mode, shape, bias):
    n, h, v, options = SHAPES[shape]
    hidden_dtype, weight_dtype, autocast = MODES[mode]
    compute_dtype = autocast or torch.promote_types(hidden_dtype, weight_dtype)
    prediction = predict_peak_bytes(n, h, v, hidden_dtype=hidden_dtype, weight_dtype=weight_dtype,
                                    compute_dtype=compute_dtype, has_bias=bias,
                                    bias_dtype=weight_dtype if bias else None, impl="torch", **options)
    rows = prediction.plan.rows
    assert (rows < n) == (shape == "row-chunks") and (prediction.plan.cols < v) == (shape == "vocab-chunks")
    measured = _forward_peak(n, h, v, hidden_dtype, weight_dtype, autocast, bias, options)
    acc_bytes = 4  # fp32 accumulation
    assert measured == prediction.forward - (4 * n - 3 * rows) * acc_bytes, (measured, prediction.forward)
