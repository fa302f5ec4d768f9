"""Helpers of ``model_diagnosis.sh``: write the HF config dicts, print the closing table.

``python benchmarks/device/model_diagnosis.py configs DIR [--tiny]`` writes ``llama-1b.json``
and ``qwen2-0.5b.json`` (a ~1.1B Llama-like and a ~0.5B Qwen2-like tied config; ``--tiny``:
CPU-sized versions for the dry run). ``python benchmarks/device/model_diagnosis.py table DIR...``
prints one line per measured row of each run folder (model, explain) and writes
``table.md`` in the current folder.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "llama-1b": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                 "bos_token_id": 1, "eos_token_id": 2},
    "qwen2-0.5b": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                   "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                   "rope_theta": 1000000.0, "bos_token_id": None, "eos_token_id": None},
}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512}


def write_configs(folder: Path, tiny: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, config in CONFIGS.items():
        config = {**config, **(TINY if tiny else {})}
        (folder / f"{name}.json").write_text(json.dumps(config, indent=1))
        print(f"wrote {folder / (name + '.json')}")


def table(folders: list[Path]) -> None:
    from fusedce_profiler.instrument.tracing.attribution import logits_verdict
    from fusedce_profiler.instrument.step.jobs import load_model_results
    from fusedce_reports.attribution_tables import largest_term
    from fusedce_reports.units import format_bytes

    lines = ["| run | back-end | status | peak allocated | nvidia-smi | LM-head/loss at peak | logits | largest term |",
             "|---|---|---|---|---|---|---|---|"]
    for folder in folders:
        if (folder / "explain.json").is_file():
            from fusedce_profiler.judgements.explain.records import load_explanation

            e = load_explanation(folder)
            best = e.consistent[0].label() if e.consistent else "none consistent"
            lines.append(f"| {folder.name} | explain | {'decided' if e.decided else 'NOT decided'} | "
                         f"{len(e.consistent)} consistent | best: {best} | | | {e.conclusion[:120]} |")
            continue
        if not (folder / "model_results.jsonl").is_file():
            lines.append(f"| {folder.name} | – | missing | | | | | |")
            continue
        for r in load_model_results(folder).records:
            m, a = r.memory, r.attribution
            lines.append(
                f"| {folder.name} | {r.job.label} | {r.status if r.status == 'ok' else r.status + ': ' + r.message[:60]} | "
                f"{format_bytes(m.peak) if m else '–'} | "
                f"{format_bytes(m.smi_peak) if m and m.smi_peak is not None else '–'} | "
                f"{format_bytes(a.group_bytes('LM-head/loss')) if a else '–'} | "
                f"{logits_verdict(a, naive=r.job.backend == 'torch')[0] if a else '–'} | "
                f"{largest_term(a)[:90] if a else '–'} |")
    text = "\n".join(lines)
    Path("table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    if sys.argv[1] == "configs":
        write_configs(Path(sys.argv[2]), "--tiny" in sys.argv)
    else:
        table([Path(p) for p in sys.argv[2:]])
