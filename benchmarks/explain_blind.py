"""Blind benchmark of ``explain``: readings from a model it does not build, fed without their
configuration, judged against the known truth.

Ground truth (``truth``, its own process, so that ``explain``'s workers later see an idle GPU):
a Hugging Face GPT-2-style model built from a config (12 layers, H=768, FFN 2304, V=32777,
learned positions, untied head, no dropout — the shapes of ``explain``'s ``user-gpt`` preset,
another implementation; ``--implementation blind-gpt``: the GPT of :mod:`benchmarks.blind_models`,
written for these benchmarks, at the same shapes), trained 3 steps by Lightning ``Trainer.fit`` in ``bf16-mixed`` under a
24 GiB cap (``set_per_process_memory_fraction``), at each configuration of :data:`CASES`, with
the naive loss and with a user-style fused-loss wrapper. The wrapper calls
``fusedce.linear_cross_entropy`` on the final norm's output — unless its guard wants bf16 hidden
states (``guard``): under autocast the LayerNorm's output is fp32, so that wrapper silently falls
back to logits and ``F.cross_entropy`` (the fused path NOT active). An evaluation pass is
Lightning's sanity check computing the full logits. Each reading is what ``nvidia-smi`` shows for
the process: ``mem_get_info`` used (context + reserved), the maximum over the training steps.

Then every case's two readings go to :func:`fusedce_profile.explain.explain` with ``card=24`` and
what a user knows of their model (untied), nothing of the run; the calibration steps are shared
between cases through one cache file. Per case: is the truth consistent, how many (family, fused
path) pairs are, and was a "decided" verdict right.

``python benchmarks/explain_blind.py --out DIR [--budget-s 500] [--tiny]`` (``--tiny``: CPU dry run
at tiny sizes; its "readings" are the process's peak allocated bytes and mean nothing).
Writes ``DIR/truth.jsonl``, ``DIR/results.jsonl``, ``DIR/summary.md``, ``DIR/cases/<name>/``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CARD_GIB = 24


@dataclass
class Case:
    """One known configuration (``fused``: the wrapper's fused path is active)."""

    name: str
    attention: str
    seq: int
    batch: int
    fused: bool
    checkpointing: bool = False
    eval_step: bool = False


CASES = [
    Case("sdpa-1024x18-fused", "sdpa", 1024, 18, True),  # B=24: the naive step OOMs under the cap
    Case("sdpa-1024x16-inactive", "sdpa", 1024, 16, False),
    Case("eager-2048x3-fused-eval", "eager", 2048, 3, True, eval_step=True),  # B=4: the naive step OOMs
    Case("eager-2048x3-inactive", "eager", 2048, 3, False),
    Case("sdpa-512x32-fused", "sdpa", 512, 32, True),
    Case("sdpa-2048x8-inactive-eval", "sdpa", 2048, 8, False, eval_step=True),
    Case("eager-512x16-fused-ckpt", "eager", 512, 16, True, checkpointing=True),
    Case("sdpa-1024x32-fused-ckpt", "sdpa", 1024, 32, True, checkpointing=True),
    Case("eager-1024x8-inactive", "eager", 1024, 8, False),
    Case("sdpa-2048x12-fused-ckpt-eval", "sdpa", 2048, 12, True, checkpointing=True, eval_step=True),
    Case("eager-1024x6-fused-eval", "eager", 1024, 6, True, eval_step=True),
    Case("sdpa-512x40-inactive-ckpt", "sdpa", 512, 40, False, checkpointing=True),
]
DESIGN_HALF = frozenset(c.name for c in CASES[0::2]) | {"eager-2048x4-fused-eval"}
"""The cases the judging was designed on (every other case of :data:`CASES`, fixed before
looking at any case's terms; with the twelfth case's earlier name); the others are reported
apart as the held-out half."""
TINY = dict(hidden=64, layers=2, heads=4, ffn=192, vocab=512, positions=256)
FULL = dict(hidden=768, layers=12, heads=12, ffn=2304, vocab=32777, positions=2048)


def tiny_case(case: Case) -> Case:
    return Case(case.name, case.attention, {512: 32, 1024: 64, 2048: 128}[case.seq], max(2, case.batch // 4),
                case.fused, case.checkpointing, case.eval_step)


# --- ground truth (own process) ---------------------------------------------------------------

def _gpt2(shape: dict, attention: str, checkpointing: bool):
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=shape["vocab"], n_positions=shape["positions"], n_embd=shape["hidden"],
                        n_layer=shape["layers"], n_head=shape["heads"], n_inner=shape["ffn"], resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class _HFAccess:
    """Logits, the final norm's output and the head's weight of a Hugging Face GPT-2."""

    @staticmethod
    def logits(model, ids):
        return model(input_ids=ids).logits

    @staticmethod
    def hidden(model, ids):
        return model.transformer(input_ids=ids).last_hidden_state

    @staticmethod
    def head_weight(model):
        return model.lm_head.weight


class _BlindAccess:
    """The same of :class:`benchmarks.blind_models.BlindGPT`."""

    @staticmethod
    def logits(model, ids):
        return model(ids)

    @staticmethod
    def hidden(model, ids):
        return model.hidden_states(ids)

    @staticmethod
    def head_weight(model):
        return model.lm_head.weight


IMPLEMENTATIONS = ("hf-gpt2", "blind-gpt")
"""The ground truth's model: Hugging Face's GPT-2, or the GPT of :mod:`benchmarks.blind_models`."""


def build_truth_model(implementation: str, shape: dict, attention: str, checkpointing: bool):
    """``(model, access)`` of the ground truth's ``implementation`` at ``shape``."""
    if implementation == "hf-gpt2":
        return _gpt2(shape, attention, checkpointing), _HFAccess
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from blind_models import BlindGPT

    model = BlindGPT(shape["vocab"], shape["hidden"], shape["layers"], shape["heads"], shape["ffn"],
                     shape["positions"], spelled_out=attention == "eager")
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model, _BlindAccess


def _reading(device) -> int:
    import torch

    if device.type != "cuda":
        return int(torch.cuda.max_memory_allocated(device)) if torch.cuda.is_available() else 0
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def train_once(case: Case, shape: dict, loss: str, device_name: str, implementation: str = "hf-gpt2") -> dict:
    """One ``Trainer.fit`` of 3 steps; ``loss``: naive, fused (the wrapper) — the wrapper's fused
    path active when ``case.fused``. Returns the reading (bytes) and what else was seen."""
    import gc
    import resource

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from fusedce import linear_cross_entropy

    try:
        import lightning as L
    except ImportError:  # the device image has the older package name only
        import pytorch_lightning as L
    device = torch.device(device_name)
    guard = loss == "fused" and not case.fused  # the wrapper that wants bf16 hidden states

    def user_loss(hidden, weight, targets):
        if guard and hidden.dtype != torch.bfloat16:  # autocast's LayerNorm gives fp32: falls back
            return F.cross_entropy(F.linear(hidden, weight).float(), targets)
        return linear_cross_entropy(hidden, weight, targets)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.access = build_truth_model(implementation, shape, case.attention, case.checkpointing)
            self.readings: list[int] = []

        def training_step(self, batch, batch_idx):
            ids, targets = batch
            if loss == "naive":
                logits = self.access.logits(self.model, ids)
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            hidden = self.access.hidden(self.model, ids)
            return user_loss(hidden.reshape(-1, hidden.shape[-1]), self.access.head_weight(self.model),
                             targets.reshape(-1))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.readings.append(_reading(device))

        def validation_step(self, batch, batch_idx):
            ids, targets = batch
            logits = self.access.logits(self.model, ids)  # full logits, as an accuracy metric would
            self.log("val_loss", F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    gen = torch.Generator().manual_seed(0)
    n = case.batch * 3
    data = TensorDataset(torch.randint(0, shape["vocab"], (n, case.seq), generator=gen),
                         torch.randint(0, shape["vocab"], (n, case.seq), generator=gen))
    loader = DataLoader(data, batch_size=case.batch)
    val = DataLoader(TensorDataset(*[t[:case.batch] for t in data.tensors]), batch_size=case.batch)
    module = Module()
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, precision="bf16-mixed",
                        max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=1 if case.eval_step else 0,
                        limit_val_batches=1 if case.eval_step else 0, check_val_every_n_epoch=1000)
    row = {"loss": loss, "status": "ok"}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        trainer.fit(module, loader, val if case.eval_step else None)
        if device.type == "cuda":
            row["reading"] = max(module.readings)
            row["peak_allocated"] = int(torch.cuda.max_memory_allocated(device))
            row["peak_reserved"] = int(torch.cuda.max_memory_reserved(device))
            row["reserved_end"] = int(torch.cuda.memory_reserved(device))
            row["alloc_retries"] = int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
        else:  # dry run: a stand-in figure that only exercises the code path
            row["reading"] = max(1, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    except torch.OutOfMemoryError as exc:
        row["status"], row["message"] = "oom", str(exc).splitlines()[0]
    del trainer, module
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return row


def truth(args) -> None:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type == "cuda":
        torch.empty(1, device=device)
        free, total = torch.cuda.mem_get_info(device)
        context = total - free - torch.cuda.memory_reserved(device)
        torch.cuda.set_per_process_memory_fraction((CARD_GIB * (1 << 30) - context) / total, torch.cuda.current_device())
    shape = TINY if args.tiny else FULL
    out = Path(args.out) / "truth.jsonl"
    for case in CASES[:args.cases]:
        case = tiny_case(case) if args.tiny else case
        start = time.perf_counter()
        rows = {loss: train_once(case, shape, loss, str(device), args.implementation) for loss in ("naive", "fused")}
        record = {"case": asdict(case), "implementation": args.implementation, "naive": rows["naive"],
                  "fused": rows["fused"],
                  "seconds": time.perf_counter() - start}
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


# --- explain on the readings ------------------------------------------------------------------

def judge(case: Case, e) -> dict:
    """Whether the truth is among the consistent hypotheses, their count, and the verdict."""
    fam = (case.attention, False, case.checkpointing, case.eval_step, case.seq)
    matching = [h for h in e.consistent if (h.family.attention, h.family.tied, h.family.checkpointing,
                                               h.family.eval_step, h.family.seq) == fam and h.fused_active == case.fused]
    right = None
    if e.decided:
        right = all(h.fused_active == case.fused for h in e.consistent)
    classes = {(h.family.attention, h.family.checkpointing, h.fused_active) for h in e.consistent}
    return {"truth_consistent": bool(matching),
            "consistent_classes": len(classes),
            "fused_path_settled": {h.fused_active for h in e.consistent} == {case.fused},
            "truth_batch_in_range": any(h.batch_range and h.batch_range[0] <= case.batch <= h.batch_range[1]
                                        for h in matching),
            "consistent_families": e.consistent_families, "decided": e.decided, "decided_right": right,
            "conclusion": e.conclusion, "confirmations": e.confirmations,
            "consistent": [h.label() for h in e.consistent][:12]}


def run_explains(args, truths: list[dict]) -> list[dict]:
    from fusedce_profile.explain import explain

    out = Path(args.out)
    results, start = [], time.perf_counter()
    for t in truths:
        case = Case(**t["case"])
        if t["naive"]["status"] != "ok" or t["fused"]["status"] != "ok":
            results.append({"case": case.name, "skipped": "the ground truth did not fit the card"})
            continue
        naive, fused = t["naive"]["reading"] / (1 << 20), t["fused"]["reading"] / (1 << 20)
        left = args.budget_s - (time.perf_counter() - start)
        confirm = args.confirm if left > 60 else 0
        case_start = time.perf_counter()
        kwargs = dict(naive=naive, fused=fused, fused_larger=fused > naive, card=CARD_GIB, tied=False,
                      confirm=confirm, cache=out / "calibration_cache.jsonl", out=out / "cases" / case.name)
        if args.tiny:
            kwargs.update(preset="tiny", device="cpu", seq_candidates=(32, 64, 128), card=CARD_GIB)
        row = {"case": case.name, "truth": asdict(case), "naive_mib": naive, "fused_mib": fused, "confirm": confirm}
        try:
            e = explain(**kwargs)
            row.update(judge(case, e))
        except Exception as exc:  # a failed explain is a result of the benchmark
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["seconds"] = time.perf_counter() - case_start
        results.append(row)
        with (out / "results.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("case", "truth_consistent", "consistent_families", "decided",
                                                   "decided_right", "seconds", "error")}), flush=True)
    return results


def summarise(results: list[dict], title: str = "explain blind benchmark") -> str:
    judged = [r for r in results if "truth_consistent" in r]
    consistent = sum(r["truth_consistent"] for r in judged)
    families = [r["consistent_families"] for r in judged]
    classes = [r["consistent_classes"] for r in judged if "consistent_classes" in r]
    settled = sum(1 for r in judged if r.get("fused_path_settled"))
    wrong = sum(1 for r in judged if r["decided"] and not r["decided_right"])
    decided = sum(1 for r in judged if r["decided"])
    lines = [f"# {title}", "",
             f"- truth consistent: {consistent} of {len(judged)} (goal ≥ 11 of 12)",
             f"- median consistent families: {statistics.median(families) if families else '–'} (goal ≤ 3)",
             f"- median consistent classes (attention × checkpointing × fused path; T, the evaluation pass and "
             f"B not counted): {statistics.median(classes) if classes else '–'}",
             f"- the fused path's state settled (every consistent hypothesis has the true one): {settled} of "
             f"{len(judged)}",
             f"- decided: {decided}, wrong decided: {wrong} (goal 0)", "",
             "| case | naive MiB | fused MiB | truth consistent | B in range | families | classes | decided | right | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "truth_consistent" not in r:
            lines.append(f"| {r['case']} | – | – | {r.get('skipped') or r.get('error')} | | | | | | |")
            continue
        lines.append(f"| {r['case']} | {r['naive_mib']:,.0f} | {r['fused_mib']:,.0f} | {r['truth_consistent']} | "
                     f"{r['truth_batch_in_range']} | {r['consistent_families']} | {r.get('consistent_classes', '–')} | "
                     f"{r['decided']} | "
                     f"{r['decided_right']} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def summarise_halves(results: list[dict]) -> str:
    """The whole summary, then the design and the held-out half (:data:`DESIGN_HALF`) apart."""
    halves = [summarise([r for r in results if (r["case"] in DESIGN_HALF) == (half == "design")],
                        title=f"{half} half") for half in ("design", "held-out")]
    return summarise(results) + "\n" + "\n".join(halves)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=400.0, help="seconds for the explains (confirmations "
                                                                      "stop when under a minute is left)")
    parser.add_argument("--confirm", type=int, default=2)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--implementation", choices=IMPLEMENTATIONS, default="hf-gpt2",
                        help="the ground truth's model (the readings' source; explain never sees it)")
    parser.add_argument("--truth-only", action="store_true")
    parser.add_argument("--skip-truth", action="store_true")
    parser.add_argument("--cases", type=int, default=len(CASES), help="only the first N cases")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.truth_only:
        return truth(args)
    if not args.skip_truth:
        cmd = [sys.executable, __file__, "--out", str(out), "--truth-only", "--cases", str(args.cases),
               "--implementation", args.implementation] + (["--tiny"] if args.tiny else [])
        subprocess.run(cmd, check=False)
    truths = [json.loads(line) for line in (out / "truth.jsonl").read_text().splitlines() if line.strip()]
    results = run_explains(args, truths)
    made_by = sorted({t.get("implementation", "hf-gpt2") for t in truths})
    text = (f"Ground truth: {', '.join(made_by)} trained by Lightning bf16-mixed (`truth.jsonl`).\n\n"
            + summarise_halves(results))
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
