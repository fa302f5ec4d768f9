"""Float64 reference for ``fusedce.linear_cross_entropy``, written from the specification.

The reference upcasts copies of the inputs to float64, builds the full ``(N, V)`` logits and
lets autograd produce the gradients. It is deliberately naive: it exists to be obviously
right, not fast. Shapes: ``hidden (..., H)``, ``weight (V, H)``, ``target hidden.shape[:-1]``
(int64), ``bias (V,)``. Everything it returns is float64 on the inputs' device.

Per-token loss, in exact arithmetic (``lse`` = log-sum-exp of the logits)::

    logits = hidden @ weight.T (+ bias);  if softcap: logits = softcap * tanh(logits / softcap)
    loss_i = (1 - eps) * (lse_i - logits[i, y_i]) + eps * (lse_i - mean_v logits[i, v])
             + z_loss * lse_i ** 2                                      (eps = label_smoothing)
    loss_i = 0 where y_i == ignore_index

``mean`` divides the sum by the number of non-ignored tokens (nan when there are none, as
``F.cross_entropy`` does), ``sum`` sums, ``none`` keeps ``target``'s shape.

Besides the reference (one-shot, and row-chunked for GPU-sized inputs) this module holds
what every fusedce test file shares: seeded input generation with realistic logit scales,
running the fused loss with a non-trivial upstream gradient, the comparison helpers, and
the option combinations the value tests sweep. It does not import ``fusedce``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOptions:
    """Keyword options of ``fusedce.linear_cross_entropy`` that define the value."""

    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    softcap: float | None = None

    def as_kwargs(self) -> dict:
        return dict(
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            z_loss=self.z_loss,
            softcap=self.softcap,
        )


@dataclass(frozen=True)
class LossAndGrads:
    """A loss value and the gradients of (upstream · loss); a gradient is None when not asked."""

    loss: torch.Tensor
    grad_hidden: torch.Tensor | None
    grad_weight: torch.Tensor | None
    grad_bias: torch.Tensor | None


def reference_per_token_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    options: LossOptions,
) -> torch.Tensor:
    """Per-token losses, shape ``target.shape``, in the inputs' dtype (float64 when called below)."""
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.T
    if bias is not None:
        logits = logits + bias
    if options.softcap is not None:
        logits = options.softcap * torch.tanh(logits / options.softcap)
    flat_target = target.reshape(-1)
    valid = flat_target != options.ignore_index
    safe_target = torch.where(valid, flat_target, torch.zeros_like(flat_target))
    lse = torch.logsumexp(logits, dim=-1)
    nll = lse - logits.gather(1, safe_target[:, None]).squeeze(1)
    smooth = lse - logits.mean(dim=-1)
    eps = options.label_smoothing
    per_token = (1.0 - eps) * nll + eps * smooth + options.z_loss * lse.square()
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    return per_token.reshape(target.shape)


def reduce_loss(per_token: torch.Tensor, target: torch.Tensor, options: LossOptions) -> torch.Tensor:
    """Apply ``options.reduction`` to per-token losses (``mean`` over non-ignored tokens)."""
    if options.reduction == "none":
        return per_token
    if options.reduction == "sum":
        return per_token.sum()
    count = (target != options.ignore_index).sum()
    return per_token.sum() / count


def reference_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: LossOptions = LossOptions(),
    upstream: torch.Tensor | float | None = None,
) -> LossAndGrads:
    """Float64 loss and the gradients of ``sum(upstream * loss)``.

    Gradients are computed for the inputs that have ``requires_grad`` set (None for the rest).
    ``upstream`` is the gradient flowing into the loss: a tensor of ``target``'s shape for
    ``reduction='none'``, a float for a scalar loss (default 1.0).
    """
    leaves = {}

    def upcast(name: str, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        copy = t.detach().to(torch.float64)
        if t.requires_grad:
            copy.requires_grad_(True)
            leaves[name] = copy
        return copy

    h64, w64, b64 = upcast("hidden", hidden), upcast("weight", weight), upcast("bias", bias)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        loss = reduce_loss(reference_per_token_loss(h64, w64, target, b64, options), target, options)
        if leaves:
            if upstream is None:
                upstream = 1.0
            up = torch.as_tensor(upstream, dtype=torch.float64, device=loss.device)
            grads = torch.autograd.grad((loss * up).sum(), list(leaves.values()))
            found = dict(zip(leaves, grads))
        else:
            found = {}
    return LossAndGrads(
        loss=loss.detach(),
        grad_hidden=found.get("hidden"),
        grad_weight=found.get("weight"),
        grad_bias=found.get("bias"),
    )


def chunked_reference_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: LossOptions = LossOptions(),
    upstream: torch.Tensor | float | None = None,
    rows_per_chunk: int = 256,
) -> LossAndGrads:
    """The same float64 values as :func:`reference_linear_cross_entropy`, ``rows_per_chunk`` tokens
    at a time, so that GPU-sized inputs (N·V beyond 2³¹) fit: peak ≈ a few × rows·V·8 bytes.

    The loss of token i depends only on row i, so each chunk's loss is computed and
    differentiated on its own; grad_weight and grad_bias sum over chunks in float64.
    """
    flat_hidden = hidden.detach().reshape(-1, hidden.shape[-1])
    flat_target = target.reshape(-1)
    n = flat_target.numel()
    w64 = weight.detach().to(torch.float64).requires_grad_(weight.requires_grad)
    b64 = None if bias is None else bias.detach().to(torch.float64).requires_grad_(bias.requires_grad)
    if upstream is None:
        upstream = 1.0
    if options.reduction == "none":
        token_weight = torch.as_tensor(upstream, dtype=torch.float64, device=hidden.device).reshape(-1)
    else:
        scale = float(upstream)
        if options.reduction == "mean":
            count = int((flat_target != options.ignore_index).sum())
            scale = scale / count if count else 0.0  # no valid token: every gradient is 0
        valid = flat_target != options.ignore_index
        token_weight = valid.to(torch.float64) * scale
    per_token = torch.empty(n, dtype=torch.float64, device=hidden.device)
    grad_hidden = torch.empty(flat_hidden.shape, dtype=torch.float64, device=hidden.device)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        for start in range(0, n, rows_per_chunk):
            rows = slice(start, min(n, start + rows_per_chunk))
            h64 = flat_hidden[rows].to(torch.float64).requires_grad_(hidden.requires_grad)
            chunk_loss = reference_per_token_loss(h64, w64, flat_target[rows], b64, options)
            per_token[rows] = chunk_loss.detach()
            if hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad):
                (chunk_loss * token_weight[rows]).sum().backward()
            if hidden.requires_grad:
                grad_hidden[rows] = h64.grad
    loss = reduce_loss(per_token.reshape(target.shape), target, options)
    return LossAndGrads(
        loss=loss,
        grad_hidden=grad_hidden.reshape(hidden.shape) if hidden.requires_grad else None,
        grad_weight=_grad_or_zeros(w64) if weight.requires_grad else None,
        grad_bias=_grad_or_zeros(b64) if (bias is not None and bias.requires_grad) else None,
    )


def _grad_or_zeros(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64 (absolute error when ‖expected‖ is 0)."""
    diff = torch.linalg.vector_norm(actual.double() - expected.double()).item()
    scale = torch.linalg.vector_norm(expected.double()).item()
    return diff / scale if scale > 0 else diff


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, name: str) -> None:
    """Norm-wise relative error ≤ ``rtol``, and element-wise ``|a − e| ≤ 10·rtol·(|e| + max|e|)``.

    The norm check bounds the overall error; the looser element-wise check catches a few
    entries gone wrong (one chunk, one bias entry) that a norm over many entries would hide.
    Single entries may legitimately exceed ``rtol``: soft-capping's ``1 − tanh²`` and sums with
    cancellation amplify rounding. ``actual`` may be any floating dtype; compared in float64.
    """
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double(), expected.detach().double()
    if e.numel() == 0:
        return
    if torch.isnan(e).any():
        torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{name}: {m}")
        return
    floor = 10 * rtol * e.abs().max().item()
    torch.testing.assert_close(a, e, rtol=10 * rtol, atol=floor, msg=lambda m: f"{name}: {m}")
    err = relative_error(a, e)
    assert err <= rtol, f"{name}: relative error {err:.3g} > {rtol:g}"


def assert_matches_reference(
    result: LossAndGrads, expected: LossAndGrads, *, rtol: float, norm_only: bool = False
) -> None:
    """Compare every field of ``result`` with ``expected`` (both LossAndGrads).

    ``norm_only`` drops the element-wise check (for low-precision runs, where single entries
    may round far more than the tensor as a whole).
    """
    for field in ("loss", "grad_hidden", "grad_weight", "grad_bias"):
        got, want = getattr(result, field), getattr(expected, field)
        if want is None:
            assert got is None, f"{field}: expected no gradient, got one"
            continue
        assert got is not None, f"{field}: gradient missing"
        if norm_only:
            assert got.shape == want.shape, f"{field}: shape {tuple(got.shape)} != {tuple(want.shape)}"
            err = relative_error(got, want)
            assert err <= rtol, f"{field}: relative error {err:.3g} > {rtol:g}"
        else:
            assert_close_to_reference(got, want, rtol=rtol, name=field)


def run_fused(
    fn,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    upstream: torch.Tensor | float | None = None,
    **kwargs,
) -> LossAndGrads:
    """Call ``fn(hidden, weight, target, bias, **kwargs)`` and backpropagate ``upstream``.

    Returns the loss and the ``.grad`` of each leaf that requires grad (None otherwise); the
    leaves' ``.grad`` are cleared first.
    """
    inputs = (hidden, weight, bias)
    for t in inputs:
        if t is not None:
            t.grad = None
    loss = fn(hidden, weight, target, bias, **kwargs)
    if loss.requires_grad:
        if upstream is None:
            upstream = 1.0
        up = torch.as_tensor(upstream, dtype=loss.dtype, device=loss.device)
        loss.backward(up.expand_as(loss) if loss.dim() else up)
    grads = [t.grad if (t is not None and t.requires_grad) else None for t in inputs]
    return LossAndGrads(loss=loss.detach(), grad_hidden=grads[0], grad_weight=grads[1], grad_bias=grads[2])


def make_inputs(
    n: int,
    h: int,
    v: int,
    *,
    seed: int,
    logit_std: float = 3.0,
    ignore_fraction: float = 0.0,
    with_bias: bool = False,
    ignore_index: int = -100,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    batch_shape: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random leaf inputs with realistic logit scales: ``(hidden, weight, target, bias)``.

    ``hidden ~ N(0, 1)`` and ``weight ~ N(0, (logit_std²/H))`` so the logits have standard
    deviation ≈ ``logit_std``; ``bias ~ N(0, 1)``. A fraction ``ignore_fraction`` of the
    targets is set to ``ignore_index``. ``batch_shape`` (product ``n``) reshapes hidden/target
    to ``(*batch_shape, H)`` / ``batch_shape``. All floating tensors require grad.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen)
    weight = torch.randn(v, h, generator=gen) * (logit_std / max(h, 1) ** 0.5)
    target = torch.randint(0, v, (n,), generator=gen)
    if ignore_fraction > 0:
        ignored = torch.rand(n, generator=gen) < ignore_fraction
        target = torch.where(ignored, torch.full_like(target, ignore_index), target)
    bias = torch.randn(v, generator=gen) if with_bias else None
    if batch_shape is not None:
        hidden, target = hidden.reshape(*batch_shape, h), target.reshape(batch_shape)

    def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype).requires_grad_(True)

    return leaf(hidden), leaf(weight), target.to(device), leaf(bias)


# --- The option sets the value tests sweep (shared by the torch-path and Triton tests) ---


@dataclass(frozen=True)
class OptionCase:
    """One combination of options, plus how to build inputs for it."""

    options: LossOptions = LossOptions()
    with_bias: bool = False
    ignore_fraction: float = 0.0


OPTION_CASES: dict[str, OptionCase] = {
    "plain": OptionCase(),
    "ignored_targets": OptionCase(ignore_fraction=0.3),
    "ignore_index_is_a_class": OptionCase(LossOptions(ignore_index=5), ignore_fraction=0.2),
    "label_smoothing": OptionCase(LossOptions(label_smoothing=0.1)),
    "label_smoothing_one": OptionCase(LossOptions(label_smoothing=1.0)),
    "z_loss": OptionCase(LossOptions(z_loss=1e-3)),
    "softcap": OptionCase(LossOptions(softcap=4.0)),
    "bias": OptionCase(with_bias=True),
    "mixed": OptionCase(
        LossOptions(label_smoothing=0.1, z_loss=1e-3, softcap=4.0), with_bias=True, ignore_fraction=0.3
    ),
}

# At V = 1 the cross-entropy part of the gradient is 0 and only the z-loss part is left. A
# realistic z_loss (1e-3) makes those gradients ~1000× smaller than ordinary ones, so fp32
# rounding of the (zero) cross-entropy part, ~1e-7 absolute, would look like a 1e-5 relative
# error. A large z_loss keeps them at the usual scale.
SINGLE_CLASS_CASE = OptionCase(
    LossOptions(label_smoothing=0.1, z_loss=0.1, softcap=4.0), with_bias=True, ignore_fraction=0.3
)


def case_for_vocab(v: int, case: OptionCase) -> OptionCase:
    """``case``, or SINGLE_CLASS_CASE when V = 1 and the case has z-loss (see above)."""
    return SINGLE_CLASS_CASE if v == 1 and case.options.z_loss else case


REDUCTIONS = ("mean", "sum", "none")


def seed_for(*parts) -> int:
    """A distinct, reproducible seed per test case (CRC32 of the case's description)."""
    return zlib.crc32(repr(parts).encode())


def make_upstream(target: torch.Tensor, reduction: str, seed: int) -> torch.Tensor | float:
    """A non-trivial gradient for the loss: random per token for 'none', a scalar ≠ 1 otherwise."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if reduction == "none":
        return torch.randn(target.shape, generator=gen).to(target.device)
    return 0.5 + torch.rand((), generator=gen).item()


def check_against_reference(
    fn,
    n: int,
    h: int,
    v: int,
    case: OptionCase,
    reduction: str,
    *,
    rtol: float,
    seed: int,
    batch_shape: tuple[int, ...] | None = None,
    device: str | torch.device = "cpu",
    **fn_kwargs,
) -> LossAndGrads:
    """Build inputs for ``case``, run ``fn`` (e.g. a partial of ``linear_cross_entropy``) with a
    non-trivial upstream gradient, and assert loss and every gradient match the float64 reference.
    Returns the fused result."""
    options = LossOptions(**{**case.options.as_kwargs(), "reduction": reduction})
    hidden, weight, target, bias = make_inputs(
        n, h, v, seed=seed, with_bias=case.with_bias, ignore_fraction=case.ignore_fraction,
        ignore_index=options.ignore_index, batch_shape=batch_shape, device=device,
    )
    upstream = make_upstream(target, reduction, seed + 1)
    got = run_fused(fn, hidden, weight, target, bias, upstream, **options.as_kwargs(), **fn_kwargs)
    want = reference_linear_cross_entropy(hidden, weight, target, bias, options, upstream)
    assert_matches_reference(got, want, rtol=rtol)
    return got
