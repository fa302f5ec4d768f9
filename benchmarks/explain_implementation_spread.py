"""The activations a second implementation of ``explain``'s stand-in model keeps beyond the built-in
one: Hugging Face ``GPT2LMHeadModel`` (``--implementation hf-gpt2``) or the GPT written for the blind
benchmarks (``blind-gpt``, :mod:`benchmarks.blind_models`), built at the ``user-gpt`` preset's shapes
(12 layers, H=768, FFN 2304, V=32777, learned positions, untied head, no dropout), against the
built-in model.

For each attention implementation and sequence length, one training step per model at two batch
sizes (amp-bf16, the naive loss); the slope in B of each phase's allocated peak is what that
phase holds per sample. The difference per token, divided by layers × H, is the spread ``explain``
allows a stand-in (bytes per token, layer and hidden unit): the forward phase's (activations) and
the largest over the forward, loss and backward phases (what moves the step's peak). The spread
must be measured on the device the readings come from: kernels differ (CUDA's SDPA keeps other
intermediates than the CPU's), and so does the difference.

``python benchmarks/explain_implementation_spread.py [--implementation hf-gpt2] [--device cpu] [--seqs 128]
[--batches 1,2] [--out FILE.json]``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


PHASES = ("forward", "loss", "backward")


def phase_slopes(config, source: dict | None, attention: str, seq: int, device: str,
                 batches: tuple[int, int]) -> dict[str, float]:
    """Bytes per sample of each phase's allocated peak (slope between the two ``batches``)."""
    from fusedce_profiler.instrument.step.jobs import ModelJob, run_job

    peaks = []
    for batch in batches:
        result = run_job(ModelJob(config, "torch", batch, seq, device=device, attention=attention, source=source,
                                  trace=False))
        if result.status != "ok":
            raise RuntimeError(f"{attention} B={batch}: {result.status} {result.message[:200]}")
        peaks.append({p.name: p.peak_bytes for p in result.memory.phases})
    return {name: float(peaks[1][name] - peaks[0][name]) / (batches[1] - batches[0])
            for name in PHASES if name in peaks[0] and name in peaks[1]}


def main() -> None:
    from fusedce_profiler.instrument.models.configs import get_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--implementation", choices=("hf-gpt2", "blind-gpt"), default="hf-gpt2",
                        help="the second implementation: Hugging Face's GPT-2, or benchmarks/blind_models.py")
    parser.add_argument("--seqs", default="128", help="sequence lengths, comma-separated")
    parser.add_argument("--batches", default="1,2", help="the two batch sizes of the slope")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = get_preset("user-gpt").replace(tie_word_embeddings=False)
    hf = {"model_type": "gpt2", "vocab_size": config.vocab_size, "n_positions": config.max_position_embeddings,
          "n_embd": config.hidden_size, "n_layer": config.num_hidden_layers, "n_head": config.num_attention_heads,
          "n_inner": config.intermediate_size, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
          "tie_word_embeddings": False, "use_cache": False}
    hf_source = {"kind": "hf", "hf_config": hf, "name": "gpt2-at-user-gpt-shapes", "head": None}

    def source_of(attention: str) -> dict:
        """The other implementation's model source for ``attention``."""
        if args.implementation == "hf-gpt2":
            return hf_source
        from fusedce_profiler.instrument.models.source import UserSource

        return UserSource(f"benchmarks.blind_models:{attention}_gpt", config).to_dict()
    batches = tuple(int(b) for b in args.batches.split(","))
    units = config.num_hidden_layers * config.hidden_size
    rows = []
    for seq in (int(t) for t in args.seqs.split(",")):
        for attention in ("eager", "sdpa"):
            builtin = phase_slopes(config, None, attention, seq, args.device, batches)
            other = phase_slopes(config, source_of(attention), attention, seq, args.device, batches)
            extra = {name: (other[name] - builtin[name]) / seq / units for name in builtin if name in other}
            rows.append({"device": args.device, "implementation": args.implementation, "attention": attention,
                         "seq": seq, "batches": batches,
                         "builtin_mib_per_sample": {k: v / 2 ** 20 for k, v in builtin.items()},
                         "other_mib_per_sample": {k: v / 2 ** 20 for k, v in other.items()},
                         "extra_bytes_per_token_layer_hidden": extra["forward"],
                         "extra_bytes_per_token_layer_hidden_any_phase": max(extra.values())})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        from fusedce_profiler.instrument.environment import collect_environment

        args.out.write_text(json.dumps({"rows": rows, "environment": dict(collect_environment())}, indent=1,
                                       default=str))


if __name__ == "__main__":
    main()
