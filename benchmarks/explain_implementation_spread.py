"""The activations a second implementation of ``explain``'s stand-in model keeps beyond the built-in
one: Hugging Face ``GPT2LMHeadModel`` built at the ``user-gpt`` preset's shapes (12 layers, H=768,
FFN 2304, V=32777, learned positions, untied head, no dropout) against the built-in model.

For each attention implementation, one training step per model at B=1 and B=2 (amp-bf16, T given,
the naive loss) on the CPU; the slope in B of the forward phase's allocated peak is the
activations per sample. The difference per token, divided by layers × H, is the spread
``explain`` allows a stand-in (bytes per token, layer and hidden unit).

``python benchmarks/explain_implementation_spread.py [--seq 128] [--out FILE.json]``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def forward_slope(config, source: dict | None, attention: str, seq: int) -> float:
    """Bytes per sample of the forward phase's allocated peak (B=2 minus B=1)."""
    from fusedce_profiler.instrument.step.jobs import ModelJob, run_job

    peaks = []
    for batch in (1, 2):
        result = run_job(ModelJob(config, "torch", batch, seq, device="cpu", attention=attention, source=source,
                                  trace=False))
        if result.status != "ok":
            raise RuntimeError(f"{attention} B={batch}: {result.status} {result.message[:200]}")
        peaks.append(next(p.peak_bytes for p in result.memory.phases if p.name == "forward"))
    return float(peaks[1] - peaks[0])


def main() -> None:
    from fusedce_profiler.instrument.models.configs import get_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = get_preset("user-gpt").replace(tie_word_embeddings=False)
    hf = {"model_type": "gpt2", "vocab_size": config.vocab_size, "n_positions": config.max_position_embeddings,
          "n_embd": config.hidden_size, "n_layer": config.num_hidden_layers, "n_head": config.num_attention_heads,
          "n_inner": config.intermediate_size, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
          "tie_word_embeddings": False, "use_cache": False}
    source = {"kind": "hf", "hf_config": hf, "name": "gpt2-at-user-gpt-shapes", "head": None}
    rows = []
    for attention in ("eager", "sdpa"):
        builtin = forward_slope(config, None, attention, args.seq)
        other = forward_slope(config, source, attention, args.seq)
        per_unit = (other - builtin) / args.seq / (config.num_hidden_layers * config.hidden_size)
        rows.append({"attention": attention, "seq": args.seq, "builtin_mib_per_sample": builtin / 2 ** 20,
                     "hf_gpt2_mib_per_sample": other / 2 ** 20, "extra_bytes_per_token_layer_hidden": per_unit})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        from fusedce_profiler.instrument.environment import collect_environment

        args.out.write_text(json.dumps({"rows": rows, "environment": dict(collect_environment())}, indent=1,
                                       default=str))


if __name__ == "__main__":
    main()
