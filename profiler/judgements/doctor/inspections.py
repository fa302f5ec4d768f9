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
  smoothing): matching the reference with one of them dropped names it.
- ``precision``: the error of the user's grad_W against a float64 reference from the same head
  input, beside the naive loss's under the same precision. A bf16 accumulator over chunks of rows
  adds an error that grows with the number of chunks (≈ 2⁻⁸·√chunks); an fp32 one adds none
  visible at these sizes.

Public API: :data:`JUDGES`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusedce_profiler.instrument.models.head import tensor_of
from fusedce_profiler.instrument.precision import autocast
from fusedce_profiler.judgements.doctor.checks import Context, close, norm
from fusedce_profiler.judgements.doctor.loss_options import shifted_cross_entropy

_LOW_PRECISION_FACTOR = 4.0  # grad_W error this many times the naive loss's (and above a bf16 ulp) is low precision
_BF16_HALF_ULP = 2.0 ** -9
_ROUNDING = 0.1  # a grad_W error above this is a wiring difference, not an accumulator's rounding


def _check_call(c: Context) -> tuple[str, str]:
    site = c.user.site
    if site.empty:
        return "fail", (f"your loss passed an empty tensor (numel() == 0) to {', '.join(site.empty[:3])}: the head's "
                        "weight read outside its gather (a ZeRO-3 shard); gather the parameter first "
                        "(deepspeed.zero.GatheredParameters) or call the loss inside the head module's forward")
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
                error = f"{type(exc).__name__}: {exc}"
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


def _check_options(c: Context) -> tuple[str, str]:
    active = c.options.active()
    if not active:
        return "n/a", "the model's config asks for no z-loss and no label smoothing"
    values = f"your loss {c.user.loss:.6g}, the reference with {c.options.describe()} {c.ref.loss:.6g}"
    dropped = [name for name in ("without label smoothing and z-loss", "without label smoothing", "without z-loss")
               if name in c.variants and close(c.user.loss, c.variants[name], c.tolerance / 4)
               and not close(c.variants[name], c.ref.loss, c.tolerance / 4)]
    if dropped:
        return "fail", (f"{values}: yours equals the reference {dropped[0]} ({c.variants[dropped[0]]:.6g}) — the "
                        "model's config asks for it; pass it to the loss")
    if close(c.user.loss, c.ref.loss, c.tolerance):
        return "pass", values
    return "fail", values + ": neither the config's options nor any of them dropped"


def _check_precision(c: Context) -> tuple[str, str]:
    h = c.store.get("head_input")
    info = c.built.head.info
    if h is None or not info.plain_linear or c.built.logits_of is None:
        return "n/a", "the head is not a plain linear layer: no float64 reference of grad_W"
    weight = c.built.head.weight
    if type(weight).__name__ == "DTensor":
        return "n/a", "the head's weight is sharded: grad_W judged by the gradient check on this rank's shard"
    w = weight.detach().double().requires_grad_()
    bias = c.built.head.bias
    logits = F.linear(h.double(), w, bias.detach().double() if bias is not None else None)
    transformed = c.store.get("logits")
    if transformed is not None and not torch.allclose(transformed.float(), c.store["raw"].float(), atol=1e-3):
        return "n/a", "the model transforms its logits: no float64 reference of grad_W"
    shifted_cross_entropy(logits, c.batch["labels"].to(h.device), c.options).backward()
    exact = w.grad
    user, ref = c.user.grad(c.weight_name), c.ref.grad(c.weight_name)
    if user is None or ref is None:
        return "n/a", "no grad_W to judge"
    e_user = float((user.double() - exact).norm() / exact.norm())
    e_ref = float((ref.double() - exact).norm() / exact.norm())
    dtype = str(weight.dtype).replace("torch.", "")
    numbers = (f"grad_W ({dtype}) against a float64 reference: yours {e_user:.2e}, the naive loss's under {c.mode} "
               f"{e_ref:.2e}")
    if e_user > _ROUNDING:
        return "n/a", numbers + ": more than rounding apart (a wiring difference, judged by the gradient check)"
    if e_user > _LOW_PRECISION_FACTOR * max(e_ref, _BF16_HALF_ULP / _LOW_PRECISION_FACTOR):
        return "fail", (numbers + f": your loss sums grad_W in low precision (bf16/fp16 over chunks of rows: the error "
                        "grows with the number of chunks); accumulate in fp32"
                        + (" (the weight itself is low precision: keep an fp32 accumulator)" if weight.dtype in
                           (torch.bfloat16, torch.float16) else ""))
    return "pass", numbers + ": accumulated at fp32 accuracy"


#: key → judge (see the module docstring).
JUDGES = {"call": _check_call, "eval": _check_eval, "options": _check_options, "precision": _check_precision}
