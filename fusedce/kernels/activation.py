"""Device functions shared by the kernels: soft-capping of the logits."""
import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """tanh in fp32, accurate for small and large |x|.

    For |x| ≥ 0.05: tanh|x| = (1 − e)/(1 + e) with e = exp(−2|x|) ∈ (0, 0.91], which never
    overflows and loses at most ~1e-6 relative to cancellation. Below, the Taylor series
    x − x³/3 + 2x⁵/15 − 17x⁷/315 is exact to ~1e-12.
    """
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    return tl.where(ax < 0.05, small, tl.where(x < 0.0, -big, big))


@triton.jit
def activate(x, bias_ptr, offs, mask, softcap, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """Logits as the loss sees them: softcap·tanh((x + bias)/softcap), fp32."""
    if HAS_BIAS:
        x += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        x = softcap * tanh(x / softcap)
    return x
