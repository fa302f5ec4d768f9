"""The doctor's inspections of how the loss is called: what it multiplies by, what it
materialises in evaluation, which config options it applies, and how precisely it sums grad_W.

- ``call``: the tensor the loss receives is usable — not empty (``numel() == 0``: a ZeRO-3 shard
  read outside its gather) and not a DTensor mixed with plain tensors (an FSDP2 parameter read
  outside the owning module's forward). Read from the calls the loss made, also when it raised.
- ``eval``: the loss called in training mode and under ``model.eval()`` + ``torch.no_grad()``,
  each with a forward hook on the LM head and torch's profiler
  (:class:`~fusedce_profiler.instrument.tracing.trace.StepTracer`) recording every allocation of
  N·V bytes or more. A fused path that calls the head (the model's own N×V logits) only in
  evaluation falls back there; torch's ``linear_cross_entropy`` with ``options=None`` is its
  reference path, which materialises the logits in both.
- ``options``: the loss against the reference built from the config's options (z-loss, label
  smoothing): matching the reference with one of them dropped names it — by value, or by the
  direction of the head weight's gradient (an option changes where each logit is pushed, a
  reduction or scaling only how far: at a near-uniform initialisation label smoothing barely
  moves the loss's value but turns its gradient).
- ``precision``: the dtype the user's grad_W was summed in, and its error against a float64
  reference from the same head input beside the naive loss's. For an fp32 weight, a gradient summed
  in bf16 (or fp16) and cast up has every entry exactly representable in bf16, which an fp32 sum
  has for about one entry in 65 536: that share names the accumulator. For a low-precision weight
  the error is compared with one rounding to its dtype: a bf16 accumulator over chunks of rows
  adds an error that grows with the number of chunks.

Public API: :data:`JUDGES`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from fusedce_profiler.instrument.callables import what_it_raised
from fusedce_profiler.instrument.models.head import tensor_of
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.judgements.doctor.checks import Context, close, norm
from fusedce_profiler.judgements.doctor.loss_options import left_out, shifted_cross_entropy
from fusedce_profiler.judgements.doctor.observe import naive_loss, observe

_LOW_PRECISION_FACTOR = 4.0  # grad_W error this many times one rounding (and the naive loss's) is low precision
_CHUNKED_FACTOR = 1.6  # measured: one rounding 1.0×, a bf16 sum over 31 chunks 2.3× the naive loss's error
_HELD_EXACTLY = 0.99  # the share of entries a low dtype holds exactly that betrays a sum in that dtype
_ROUNDING = 0.1  # a grad_W error above this is a wiring difference, not an accumulator's rounding


def _check_call(c: Context) -> tuple[str, str]:
    site = c.user.site
    if site.empty:
        return "fail", ("your loss used an empty floating tensor (numel() == 0) where the head's weight belongs: the "
                        "weight read outside its gather (a ZeRO-3 shard); gather the parameter first "
                        "(deepspeed.zero.GatheredParameters) or call the loss inside the head module's forward")
    sharded = type(c.built.head.weight).__name__ == "DTensor"
    failed_on_dtensor = c.user.error is not None and (site.dtensor_weight or (sharded and "DTensor" in c.user.error))
    if failed_on_dtensor and not site.mixed:
        return "fail", (f"your loss was given the head's weight as a DTensor (a sharded FSDP2/tensor-parallel "
                        f"parameter read outside its module's forward) beside plain tensors, and failed ({c.user.error}); "
                        "call the loss inside the owning module's forward, or pass weight.full_tensor()")
    if site.mixed:
        return "fail", (f"your loss mixed a DTensor with plain tensors in {', '.join(site.mixed[:3])}: a sharded "
                        "(FSDP2/tensor-parallel) parameter read outside its module's forward; call the loss inside "
                        "the owning module's forward, or pass weight.full_tensor()")
    weight = c.built.head.weight
    return "pass", (f"the loss received usable tensors (the head's weight is a {tuple(weight.shape)} "
                    f"{type(weight).__name__}, no empty shard, no DTensor mixed with plain tensors)")


def _head_run(c: Context, training: bool) -> tuple[int, int, str | None]:
    """(bytes of the head's outputs, bytes of the largest block of ≥ N·V bytes, error) of one call."""
    from fusedce_profiler.instrument.tracing.trace import StepTracer, attribute

    model, head = c.built.module, c.built.head.module
    outputs: list[int] = []
    handle = head.register_forward_hook(
        lambda mod, args, out: outputs.append(tensor_of(out).numel() * tensor_of(out).element_size()))
    b, t = c.batch["input_ids"].shape
    error = None
    try:
        model.train(training)
        with StepTracer() as tracer, torch.set_grad_enabled(training), autocast(c.mode, c.batch["input_ids"].device):
            try:
                c.fn(model, c.batch)
            except Exception as exc:  # noqa: BLE001 - evidence
                error = what_it_raised(exc)
    finally:
        handle.remove()
        model.train()
    device = c.batch["input_ids"].device
    attribution = attribute(tracer, device=device, model=model, head=head, static={}, grad_ptrs=set(), batch=b,
                            seq=t, vocab=c.built.head.info.vocab, heads=[])
    largest = max((x.bytes for x in attribution.large_tensors), default=0)
    return sum(outputs), largest, error


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _check_eval(c: Context) -> tuple[str, str]:
    v = c.built.head.info.vocab
    train_head, train_large, _ = _head_run(c, True)
    eval_head, eval_large, error = _head_run(c, False)
    if error is not None:
        return "fail", f"your loss raised under model.eval() and torch.no_grad(): {error}"
    numbers = (f"the head's own logits: {_bytes(train_head)} in training, {_bytes(eval_head)} in evaluation; the "
               f"largest block of ≥ N·V bytes: {_bytes(train_large)} in training, {_bytes(eval_large)} in evaluation")
    if c.user.site.lce_without_options:
        return "fail", ("your loss calls torch.nn.functional.linear_cross_entropy with options=None: that is torch's "
                        "reference path, linear() then cross_entropy(), which materialises the N×V logits; pass "
                        "options (a LinearCrossEntropyOptions) for its chunked path — " + numbers)
    if eval_head and not train_head:
        per_token = eval_head // max(1, c.batch["input_ids"].numel())
        return "fail", (f"the fused path falls back to materialised logits in evaluation: the head's forward runs "
                        f"under model.eval()/no_grad ({_bytes(eval_head)} here, {_bytes(per_token)} per token, "
                        f"{_bytes(per_token * 8192)} for 8192 tokens), not in training — {numbers}")
    if eval_head and train_head:
        return "pass", "your loss materialises the head's logits in training and in evaluation alike — " + numbers
    return "pass", "the same path in training and in evaluation, the head's forward never called — " + numbers


def _unit(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t / ‖t‖`` in float64 (``None`` for a missing or zero gradient)."""
    return None if t is None or norm(t) == 0 else t.double() / norm(t)


#: The logits' spread (standard deviation) the options are judged at: near a uniform prediction
#: label smoothing only scales the gradient (p − q ≈ (1 − ε)(p − onehot) when p ≈ 1/V), so a model at
#: its initialisation (logits' spread ≈ 0.1) cannot show it.
_SHARP_LOGITS = 2.0


@contextlib.contextmanager
def _sharpened_head(c: Context):
    """The head's weight scaled in place, for the body of the ``with``, so the reference's logits
    spread about :data:`_SHARP_LOGITS` (never scaled down); restored afterwards. Yields the factor."""
    spread = float(c.store["logits"].float().std()) if c.store and "logits" in c.store else 0.0
    factor = _SHARP_LOGITS / spread if 0 < spread < _SHARP_LOGITS else 1.0
    weight = c.built.head.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(factor)
    try:
        yield factor
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def _direction_left_out(c: Context) -> tuple[str | None, bool, str]:
    """Which option the user's loss leaves out, judged by the direction of the head weight's gradient.

    A reduction or a scaling multiplies every gradient by one number (judged by ``reduction``);
    label smoothing and a z-loss change what each logit is pushed towards, so the direction
    ``g / ‖g‖`` tells them apart whatever the scale — on logits spread enough to show it
    (:func:`_sharpened_head`). The user's loss, the reference and the reference with each option left
    out are observed there. Returns (the option's name or ``None``, whether the direction is the
    reference's, the evidence); distances are
    ‖ĝ_yours − ĝ‖ between unit vectors.
    """
    tol = c.group_tolerances.get(c.weight_name, c.tolerance)
    observed = lambda fn: _unit(observe(c.built, c.landmarks, fn, c.batch, c.mode,  # noqa: E731
                                        record_calls=False).grad(c.weight_name))
    with _sharpened_head(c) as factor:
        mine = observed(c.fn)
        ref = observed(lambda m, b: naive_loss(c.built, b, None, c.options))
        others = {name: observed(lambda m, b, o=without: naive_loss(c.built, b, None, o))
                  for name, without in left_out(c.options)}
    if mine is None or ref is None:
        return None, False, ""
    to_ref = float((mine - ref).norm())
    evidence = [f"with the head's weight ×{factor:.3g} (logits' spread ≈ {_SHARP_LOGITS:g}), the direction of grad "
                f"{c.weight_name} is {to_ref:.2e} from the reference's"]
    for name, other in others.items():
        if other is None:
            continue
        to_other, apart = float((mine - other).norm()), float((ref - other).norm())
        evidence.append(f"{to_other:.2e} from the reference's {name}")
        if to_other <= tol < to_ref and apart > tol:
            return name, False, "; ".join(evidence) + f" (tolerance {tol:.1e})"
    return None, to_ref <= tol, "; ".join(evidence) + f" (tolerance {tol:.1e})"


def _check_options(c: Context) -> tuple[str, str]:
    active = c.options.active()
    if not active:
        return "n/a", "the model's config asks for no z-loss and no label smoothing"
    values = f"your loss {c.user.loss:.6g}, the reference with {c.options.describe()} {c.ref.loss:.6g}"
    dropped = sorted((abs(c.user.loss - c.variants[name]), name) for name in
                     ("without label smoothing and z-loss", "without label smoothing", "without z-loss")
                     if name in c.variants and close(c.user.loss, c.variants[name], c.loss_tolerance / 4)
                     and not close(c.variants[name], c.ref.loss, c.loss_tolerance / 4))
    dropped = [name for _, name in dropped]  # the closest first
    if dropped:
        return "fail", (f"{values}: yours equals the reference {dropped[0]} ({c.variants[dropped[0]]:.6g}) — the "
                        "model's config asks for it; pass it to the loss")
    left_out, same_direction, directions = _direction_left_out(c)
    if left_out is not None:
        return "fail", (f"{values}; {directions}: your gradient points where the reference's {left_out} does — the "
                        "model's config asks for it; pass it to the loss")
    if close(c.user.loss, c.ref.loss, c.loss_tolerance):
        return "pass", values + (f"; {directions}" if directions else "")
    if same_direction:
        return "pass", (f"{values}; {directions}: the gradient points where the reference's does — the options are "
                        "applied; the value's scale is judged by the reduction check")
    return "unclear", (values + (f"; {directions}" if directions else "")
                       + ": the value differs, and not as with an option dropped (see the reduction and value checks)")


def _representable_share(g: torch.Tensor, dtype: torch.dtype) -> float:
    """The share of the non-zero entries of ``g`` that ``dtype`` holds exactly: 1.0 for a tensor
    summed in ``dtype`` and cast up, about 2⁻¹⁶ per entry for one summed in fp32 (bf16)."""
    nonzero = g[g != 0]
    if nonzero.numel() == 0:
        return 0.0
    return float((nonzero.to(dtype).to(nonzero.dtype) == nonzero).double().mean())


def _check_precision(c: Context) -> tuple[str, str]:
    h = c.store.get("head_input")
    if h is None or not c.built.head.info.plain_linear or "on the head's raw output (no transform)" in c.variants:
        return "n/a", "the head is not a plain linear layer: no float64 reference of grad_W"
    weight = c.built.head.weight
    if type(weight).__name__ == "DTensor":
        return "n/a", "the head's weight is sharded: grad_W judged by the gradient check on this rank's shard"
    user, ref = c.user.grad(c.weight_name), c.ref.grad(c.weight_name)
    if user is None or ref is None:
        return "n/a", "no grad_W to judge"
    w = weight.detach().double().requires_grad_()
    bias = c.built.head.bias
    logits = F.linear(h.double(), w, bias.detach().double() if bias is not None else None)
    shifted_cross_entropy(logits, c.batch["labels"].to(h.device), c.options).backward()
    exact = w.grad
    e_user = float((user.double() - exact).norm() / exact.norm())
    e_ref = float((ref.double() - exact).norm() / exact.norm())
    dtype = str(weight.dtype).replace("torch.", "")
    numbers = (f"grad_W ({dtype} weight) against a float64 reference: yours {e_user:.2e}, the naive loss's under "
               f"{c.mode} {e_ref:.2e}")
    if e_user > _ROUNDING:
        return "n/a", numbers + ": more than rounding apart (a wiring difference, judged by the gradient check)"
    if weight.dtype == torch.float32:
        for low in (torch.bfloat16, torch.float16):
            share, policy = _representable_share(user, low), _representable_share(ref, low)
            name = str(low).replace("torch.", "")
            if share < _HELD_EXACTLY:
                continue
            if policy < _HELD_EXACTLY:
                return "fail", (numbers + f"; {share:.0%} of its entries are exact {name} values (the naive loss's: "
                                f"{policy:.0%}): your loss sums grad_W in {name} and casts it to the fp32 weight (the "
                                "error grows with the number of chunks summed); accumulate in fp32")
            # The policy itself rounds the product to ``low`` once (autocast's matmul output):
            # a sum over chunks in ``low`` rounds once per chunk on top of that.
            if e_user > _CHUNKED_FACTOR * e_ref:
                return "fail", (numbers + f"; both are exact {name} values ({c.mode} rounds the product once), yours "
                                f"{e_user / e_ref:.2g}× as far from float64: your loss sums grad_W over chunks in {name}, "
                                "rounding once per chunk; accumulate in fp32 and round once")
            return "pass", numbers + f": rounded to {name} once, as {c.mode} rounds the naive loss's"
        return "pass", numbers + ": summed in fp32 (its entries are not confined to bf16/fp16 values)"
    once = float((exact.to(weight.dtype).double() - exact).norm() / exact.norm())
    numbers += f"; one rounding to {dtype} costs {once:.2e}"
    if e_user > _LOW_PRECISION_FACTOR * max(once, e_ref):
        return "fail", (numbers + f": your loss sums grad_W in the weight's own low precision ({dtype}) over chunks "
                        "of rows (the error grows with the number of chunks); accumulate in fp32 and round once")
    return "pass", numbers + f": rounded to {dtype} about once, accumulated at fp32 accuracy"


#: key → judge (see the module docstring).
JUDGES = {"call": _check_call, "eval": _check_eval, "options": _check_options, "precision": _check_precision}
