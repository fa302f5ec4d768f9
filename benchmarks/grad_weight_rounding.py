"""Where a pure-bf16 grad_weight's error above eager's comes from (a device probe).

In the frontier runs the fused loss's bf16 grad_weight error at 8192×768×32777 grew with the plan's
block width (``"min"`` 2304 columns: 0.001665, the default 4864: 0.001744, ``"fast"`` 27136: 0.001848)
while eager's was 0.001666 — the error of one bf16 rounding of an exact sum (relative RMS ≈ 2⁻⁹ · 0.8).
Every plan there takes all N rows in one chunk, so each vocabulary chunk of grad_weight is one product
``dᵀ @ h`` written straight into the bf16 gradient. This script separates the product from the loss:

- ``product``: d = the exact softmax gradient rounded to bf16 (the same d for every variant), then
  grad_weight[chunk] = dᵀ @ h for chunk widths C, written as bf16 by cuBLAS (``bf16-out``), or into
  fp32 then rounded once (``fp32-out``), each with PyTorch's
  ``allow_bf16_reduced_precision_reduction`` on and off;
- ``loss``: the fused loss at named budgets and forced widths, with the flag on and off, and eager.

Errors are :func:`relative_error` against the fp32 reference. Usage (device)::

    python3 benchmarks/grad_weight_rounding.py OUT.json [ROW ...]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks.protocol import make_inputs, parse_row
from fusedce import linear_cross_entropy, passes
from fusedce.options import LossOptions
from fusedce_profiler.instrument.protocol import time_calls
from fusedce_profiler.instrument.reference import reference, relative_error

FLAG = "allow_bf16_reduced_precision_reduction"


def _flag(on: bool) -> None:
    setattr(torch.backends.cuda.matmul, FLAG, on)


def exact_d(hidden, weight, target, c0: int, c1: int) -> torch.Tensor:
    """(N, c1 − c0) bf16: the mean loss's logit gradients of columns c0:c1, from fp32 logits."""
    logits = hidden.float() @ weight.float().t()
    p = torch.softmax(logits, dim=1)[:, c0:c1]
    rows = torch.arange(target.numel(), device=target.device)
    inside = (target >= c0) & (target < c1)
    p[rows[inside], target[inside] - c0] -= 1.0
    return p.div_(target.numel()).to(torch.bfloat16)


def product_errors(hidden, weight, target, ref_gw, widths) -> list[dict]:
    """grad_weight from one exact bf16 d, chunk by chunk, for each width and product variant."""
    v = weight.shape[0]
    d = exact_d(hidden, weight, target, 0, v)
    out = []
    for width in widths:
        for variant in ("bf16-out", "fp32-out"):
            for flag in (True, False):
                _flag(flag)
                gw = torch.empty_like(weight)
                for c0 in range(0, v, width):
                    c1 = min(v, c0 + width)
                    a = d[:, c0:c1].t()
                    if variant == "bf16-out":
                        torch.mm(a, hidden, out=gw[c0:c1])
                    else:
                        gw[c0:c1] = (torch.mm(a, hidden, out_dtype=torch.float32) if a.is_cuda
                                     else torch.mm(a.float(), hidden.float()))
                out.append({"part": "product", "width": width, "variant": variant, "reduced_reduction": flag,
                            "grad_weight": relative_error(gw, ref_gw)})
    _flag(True)
    return out


def _fp32_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """The candidate: a bf16 grad_weight chunk as an fp32 product rounded once by a copy."""
    if out.dtype == a.dtype and a.is_cuda:
        out.copy_(torch.mm(a, b, out_dtype=torch.float32))
    else:
        PRODUCT(out, a, b)


PRODUCT = passes._write_product
VARIANTS = ("as is", "reduction flag off", "fp32 product")


def _step(inputs, name, kwargs):
    h = inputs.hidden.detach().clone().requires_grad_()
    w = inputs.weight.detach().clone().requires_grad_()
    loss = F.cross_entropy(h @ w.t(), inputs.target) if name == "eager" else \
        linear_cross_entropy(h, w, inputs.target, **kwargs)
    loss.backward()
    return h.grad, w.grad


def _median_ms(fn, repeats: int = 7) -> float | None:
    """Median CUDA-event milliseconds of ``fn`` after one warm-up call (None on the CPU)."""
    if not torch.cuda.is_available():
        return None
    fn()
    return statistics.median(time_calls(fn, repeats, device="cuda"))


def loss_errors(inputs, ref, settings) -> list[dict]:
    """Errors and the median step time of each setting under each variant (:data:`VARIANTS`)."""
    out = []
    for name, kwargs in settings:
        for variant in VARIANTS if name != "eager" else VARIANTS[:2]:
            _flag(variant != "reduction flag off")
            passes._write_product = _fp32_product if variant == "fp32 product" else PRODUCT
            try:
                grad_h, grad_w = _step(inputs, name, kwargs)
                row = {"part": "loss", "name": name, "kwargs": {k: str(v) for k, v in kwargs.items()},
                       "variant": variant, "grad_hidden": relative_error(grad_h, ref.grad_hidden),
                       "grad_weight": relative_error(grad_w, ref.grad_weight)}
                del grad_h, grad_w
                row["ms"] = _median_ms(lambda: _step(inputs, name, kwargs))
            finally:
                passes._write_product = PRODUCT
                _flag(True)
            out.append(row)
    return out


def main(path: str, rows: list[str]) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only to check the script itself
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               FLAG: getattr(
        torch.backends.cuda.matmul, FLAG), "cases": []}
    for text in rows:
        row = parse_row(text)
        inputs = make_inputs(row, "bf16", device=device)
        ref = reference(inputs.hidden.detach(), inputs.weight.detach(), inputs.target, None, LossOptions())
        widths = sorted({min(w, row.vocab) for w in (2304, 4864, 27136, row.vocab)})
        settings = [("eager", {}), ("default", {}), ("fast", {"memory_budget": "fast"}),
                    ("min", {"memory_budget": "min"})]
        settings += [(f"default cols {w}", {"vocab_chunk_size": w}) for w in widths if w < row.vocab]
        case = {"row": text, "product": product_errors(inputs.hidden.detach(), inputs.weight.detach(),
                                                        inputs.target, ref.grad_weight, widths),
                "loss": loss_errors(inputs, ref, settings)}
        results["cases"].append(case)
        for r in case["product"] + case["loss"]:
            print(json.dumps(r), flush=True)
        del inputs, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    Path(path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["8192x768x32777"])
