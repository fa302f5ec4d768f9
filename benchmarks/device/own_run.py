"""Helpers of ``own_run.sh``: a Lightning fit of the seed's GPT recorded by the callback, doctor
on a planted-bug set, and the closing table.

``python benchmarks/device/own_run.py fit --loss naive|fused --out DIR [--append] ...``
    ``Trainer.fit`` of the built-in GPT (``--preset``: ``user-gpt`` = 12 layers, H=768,
    V=32777) in ``--precision`` (``bf16-mixed``), with
    ``fusedce_profile.lightning.StepRecorderCallback`` recording ``--steps`` (2 and 5) into
    ``DIR``; a sanity check and one validation pass (after step 3) compute the full logits, as
    an accuracy metric would. ``naive``: ``F.cross_entropy`` of the logits; ``fused``:
    ``fusedce.linear_cross_entropy`` of the final norm's output and the head's weight.
``python benchmarks/device/own_run.py doctor --jsonl FILE --folders DIR ...``
    ``run_doctor`` on each (model, wiring) of :data:`WIRINGS`: the built-in GPT untied and
    tied, the wrapped-head model of the tests with a bias, optionally a Hugging Face config
    (``--hf``). One JSON line per case, appended as it finishes: the verdicts, the checks that
    failed, whether the planted mistake was caught (``caught``) with its evidence, seconds.
    Each case's ``doctor.json`` + ``summary.md`` go to ``DIR/<model>-<wiring>``.
``python benchmarks/device/own_run.py table RECORDED_DIR DOCTOR_JSONL``
    writes ``table.md`` in the current folder and prints it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fusedce import linear_cross_entropy  # noqa: E402


# --- the Lightning fit ------------------------------------------------------------------------

def fit(args) -> None:
    try:
        import lightning as L
        from fusedce_profile.lightning import StepRecorderCallback
    except ImportError:
        import pytorch_lightning as L
        from fusedce_profile.pytorch_lightning import StepRecorderCallback
    from torch.utils.data import DataLoader, TensorDataset

    from fusedce_profiler.instrument.models.configs import get_preset
    from fusedce_profiler.instrument.models.gpt import GPT

    config = get_preset(args.preset)
    fused = args.loss == "fused"

    class GPTModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT(config, attention="sdpa", seed=0)

        def training_step(self, batch, batch_idx):
            (ids,) = batch
            if fused:  # never materialises the (B, T, V) logits
                hidden = self.model.hidden_states(ids)[:, :-1]
                return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), self.model.lm_head.weight,
                                            ids[:, 1:].reshape(-1))
            logits = self.model(ids)[:, :-1]
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

        def validation_step(self, batch, batch_idx):
            (ids,) = batch
            logits = self.model(ids)[:, :-1]  # full logits, as an accuracy metric would
            self.log("val_loss", F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4)

    L.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, config.vocab_size, (args.batch * (args.max_steps + 2), args.seq),
                                       generator=gen))
    callback = StepRecorderCallback(steps=args.steps, out=args.out, label=args.loss, fused=fused, append=args.append,
                                    force=not args.append)
    trainer = L.Trainer(max_steps=args.max_steps, precision=args.precision, callbacks=[callback], logger=False,
                        accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, limit_val_batches=1, val_check_interval=args.validate_every,
                        check_val_every_n_epoch=None, default_root_dir=str(Path(args.out).parent))
    start = time.perf_counter()
    trainer.fit(GPTModule(), DataLoader(data, batch_size=args.batch), DataLoader(data, batch_size=args.batch))
    print(f"fit {args.loss}: {time.perf_counter() - start:.1f} s; recorded into {args.out}")


# --- doctor's planted-bug set -------------------------------------------------------------------

class Access:
    """How a wiring reaches a model's parts: ``body`` (B, T, H) after the final norm, ``trunk``
    before it, the head's ``weight`` and ``bias``, another (V, H) parameter (``embedding``)."""

    def __init__(self, body, trunk, weight, bias, embedding) -> None:
        self.body, self.trunk, self.weight, self.bias, self.embedding = body, trunk, weight, bias, embedding


ACCESS = {
    "builtin": Access(lambda m, ids: m.hidden_states(ids), lambda m, ids: m.trunk(ids), lambda m: m.lm_head.weight,
                      lambda m: m.lm_head.bias, lambda m: m.embed.weight),
    "wrapped": Access(lambda m, ids: m.body(ids), lambda m, ids: m.trunk(ids), lambda m: m.head.inner.weight,
                      lambda m: m.head.inner.bias, lambda m: m.embed.weight),
    "hf": Access(lambda m, ids: m.model(ids).last_hidden_state, None, lambda m: m.lm_head.weight,
                 lambda m: m.lm_head.bias, lambda m: m.model.embed_tokens.weight),
}


def _ce(a: Access, model, hidden, labels, *, weight=None, bias="head", shift=True, **kw):
    weight = a.weight(model) if weight is None else weight
    bias = a.bias(model) if bias == "head" else bias
    if shift:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), bias, **kw)


def _no_grad_body(a, m, b):
    with torch.no_grad():
        hidden = a.body(m, b["input_ids"])
    return _ce(a, m, hidden, b["labels"])


#: (name, the check it must fail or None for a correct wiring, needs, wiring(access, model, batch)).
#: ``needs``: "trunk", "bias", "untied" — cases that apply only to models with that.
WIRINGS = [
    ("correct", None, (), lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"])),
    ("hidden.detach()", "body", (), lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]).detach(), b["labels"])),
    ("hidden under no_grad", "body", (), _no_grad_body),
    ("weight.detach()", "weight", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], weight=a.weight(m).detach())),
    ("another module's weight", "weight", ("untied",),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], weight=a.embedding(m))),
    ("targets not shifted", "shift", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], shift=False)),
    ("padding trained as token 0", "ignore", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"].clamp(min=0))),
    ("ignore_index=0 (the pad id)", "ignore", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], ignore_index=0)),
    ("reduction='sum'", "reduction", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], reduction="sum")),
    ("divided by 4 accumulation steps", "reduction", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"]) / 4),
    ("final norm skipped", "norm", ("trunk",), lambda a, m, b: _ce(a, m, a.trunk(m, b["input_ids"]), b["labels"])),
    ("bias dropped", "bias", ("bias",), lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], bias=None)),
    ("label smoothing 0.2", "loss|gradient", (),
     lambda a, m, b: _ce(a, m, a.body(m, b["input_ids"]), b["labels"], label_smoothing=0.2)),
]


def _models(args):
    """(name, access key, source, built) for each model of the set, built lazily."""
    from fusedce_profiler.instrument.models.configs import get_preset
    from fusedce_profiler.instrument.models.source import BuiltinSource, HFSource, UserSource

    config = get_preset(args.preset)
    yield "builtin-untied", "builtin", BuiltinSource(config.replace(tie_word_embeddings=False))
    yield "builtin-tied", "builtin", BuiltinSource(config.replace(tie_word_embeddings=True))
    yield "wrapped-bias", "wrapped", UserSource("tests.doctor_models:untied_bias")
    if args.hf:
        yield f"hf-{Path(args.hf).stem}", "hf", HFSource.from_reference(args.hf)


def doctor(args) -> None:
    from fusedce_profiler.instrument import store
    from fusedce_profiler.judgements.doctor.doctor import run_doctor
    from fusedce_reports.doctor_report import write_doctor_report

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folders = Path(args.folders)
    for name, key, source in _models(args):
        access = ACCESS[key]
        try:
            built = source.build(device)
        except Exception as exc:  # noqa: BLE001 - the next model still runs
            _append(args.jsonl, {"model": name, "status": "error", "message": f"{type(exc).__name__}: {exc}"})
            continue
        has = {"trunk": access.trunk is not None, "bias": built.head.bias is not None, "untied": not built.head.info.tied}
        for case, expected, needs, wiring in WIRINGS:
            if not all(has[n] for n in needs):
                continue
            start = time.perf_counter()
            row = {"model": name, "parameters": sum(p.numel() for p in built.module.parameters()),
                   "case": case, "expected": expected}
            try:
                run = run_doctor(lambda m, b, w=wiring: w(access, m, b), built, source=source, device=device,
                                 batch=args.batch, seq=args.seq, spec=f"own_run:{case}")
                verdicts = {c.key: c.verdict for c in run.checks}
                failed = [k for k, v in verdicts.items() if v == "fail"]
                caught = (not failed) if expected is None else any(k in expected.split("|") for k in failed)
                evidence = {c.key: c.evidence for c in run.checks if c.verdict == "fail"}
                row.update(status="ok", mode=run.mode, verdicts=verdicts, failed=failed, caught=caught,
                           exit_code=0 if run.passed else 1, evidence=evidence, losses=run.losses)
                folder = folders / f"{name}-{''.join(c if c.isalnum() else '-' for c in case)}"
                folder.mkdir(parents=True, exist_ok=True)
                store.write_json(folder / store.DOCTOR_FILE, run.to_dict())
                write_doctor_report(folder)
            except Exception as exc:  # noqa: BLE001
                row.update(status="error", message=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-800:])
            row["seconds"] = round(time.perf_counter() - start, 2)
            _append(args.jsonl, row)
            print(f"{name:>16} {case:<32} {row.get('mode', '')} failed={row.get('failed')} "
                  f"caught={row.get('caught')} {row['seconds']} s", flush=True)
        del built
        if device == "cuda":
            torch.cuda.empty_cache()


def _append(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


# --- the closing table --------------------------------------------------------------------------

def table(recorded: Path, doctor_jsonl: Path) -> None:
    from fusedce_profiler.instrument.recording.records import load_recorded_steps
    from fusedce_reports.units import format_bytes

    def mib(x):
        return format_bytes(x) if x is not None else "–"

    lines = ["## Lightning fit, recorded steps", "",
             "| run | step | autocast | peak allocated (phase) | peak reserved | nvidia-smi at peak | reserved at start | "
             "passes before (raised reserved) | step time |", "|---|---|---|---|---|---|---|---|---|"]
    if (recorded / "recorded_steps.jsonl").is_file():
        for r in load_recorded_steps(recorded).records:
            passes = ", ".join(f"{p.kind} " + (f"+{mib(p.raised_reserved)}" if p.raised_reserved is not None
                                                else "(reserved unavailable on the CPU)")
                               for p in r.passes_before) or "–"
            lines.append(f"| {r.label} | {r.step} | {r.autocast or '–'} | {mib(r.peak_allocated)} ({r.peak_phase}) | "
                         f"{mib(r.peak_reserved)} | {mib(r.smi_peak)} | {mib(r.reserved_at_start)} | {passes} | "
                         f"{r.time_ms:.0f} ms |")
    else:
        lines.append("| – | missing | | | | | | | |")
    lines += ["", "## doctor, planted-bug set", "", "| model | wiring | expected to fail | failed | caught | exit | s |",
              "|---|---|---|---|---|---|---|"]
    rows = [json.loads(line) for line in doctor_jsonl.read_text().splitlines() if line.strip()] \
        if doctor_jsonl.is_file() else []
    for row in rows:
        if row.get("status") != "ok":
            lines.append(f"| {row.get('model')} | {row.get('case', '–')} | {row.get('expected') or 'nothing'} | "
                         f"error: {row.get('message', '')[:80]} | no | – | {row.get('seconds', '–')} |")
            continue
        lines.append(f"| {row['model']} | {row['case']} | {row['expected'] or 'nothing'} | "
                     f"{', '.join(row['failed']) or 'nothing'} | {'yes' if row['caught'] else 'NO'} | "
                     f"{row['exit_code']} | {row['seconds']} |")
    ok = [r for r in rows if r.get("status") == "ok"]
    lines += ["", f"doctor: {sum(r['caught'] for r in ok)} of {len(rows)} cases as expected"]
    text = "\n".join(lines)
    Path("table.md").write_text(text + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fit")
    p.add_argument("--loss", choices=("naive", "fused"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--append", action="store_true")
    p.add_argument("--preset", default="user-gpt")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, nargs="+", default=[2, 5])
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--validate-every", type=int, default=3)
    p.add_argument("--precision", default="bf16-mixed")
    d = sub.add_parser("doctor")
    d.add_argument("--jsonl", required=True)
    d.add_argument("--folders", required=True)
    d.add_argument("--preset", default="user-gpt")
    d.add_argument("--hf", default=None, help="a Hugging Face config.json to add to the set")
    d.add_argument("--batch", type=int, default=4)
    d.add_argument("--seq", type=int, default=64)
    t = sub.add_parser("table")
    t.add_argument("recorded", type=Path)
    t.add_argument("doctor_jsonl", type=Path)
    args = parser.parse_args()
    {"fit": fit, "doctor": doctor, "table": lambda a: table(a.recorded, a.doctor_jsonl)}[args.command](args)


if __name__ == "__main__":
    main()
