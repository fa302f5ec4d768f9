#!/usr/bin/env bash
# Device run "explain blind" (one H200, one call of ≤ 540 s): benchmarks/explain_blind.py's 12
# known configurations — ground truth from a Hugging Face GPT-2-style model trained by Lightning
# (bf16-mixed) under a 24 GiB cap, each case's two readings then explained blind with the
# calibration steps shared — and the seed's question (explain --naive 22785 --fused 22155
# --card 24 --untied: the seed's model has an untied head) with what is left of the budget.
# Files in $OUT: nvidia-smi.txt, environment.json, blind.log, blind.tgz (truth.jsonl,
# results.jsonl, summary.md, every case's explain folder), seed.log, seed.tgz.
# IMPLEMENTATION=blind-gpt: the ground truth from benchmarks/blind_models.py instead of HF GPT-2;
# CASES=N: the first N cases only; SEED_QUESTION=0: no seed question.
# Dry run on the CPU: DRY=1 OUT=/tmp/dry bash benchmarks/device/explain_blind.sh
if [ "${DRY:-0}" = "1" ]; then
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$OUT"; echo "dry run: no GPU" > "$OUT/nvidia-smi.txt"; TINY=--tiny; SEED="--device cpu --preset tiny --seq 64"
else
  . benchmarks/device/common.sh
  TINY=; SEED=
fi
BUDGET=${BUDGET:-520}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
W=/tmp/explain-blind; rm -rf "$W"; mkdir -p "$W"
timeout 60 python3 -m fusedce_cli env --json > "$OUT/environment.json" 2>/dev/null
python3 -c "import pytorch_lightning as L, transformers; print('pytorch_lightning', L.__version__, 'transformers', transformers.__version__)" | tee "$OUT/blind.log"
timeout $(( $(left) - 60 )) python3 benchmarks/explain_blind.py --out "$W/blind" --budget-s $(( $(left) - 260 )) \
  --confirm 1 --implementation "${IMPLEMENTATION:-hf-gpt2}" --cases "${CASES:-12}" $TINY >> "$OUT/blind.log" 2>&1
echo "blind exit $? at $(( $(date +%s) - START )) s" | tee -a "$OUT/blind.log"
tar czf "$OUT/blind.tgz" --exclude='*.pickle' -C "$W" blind
if [ "${SEED_QUESTION:-1}" = "1" ] && [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) - 20 )) python3 -m fusedce_cli explain --naive 22785 --fused 22155 --card 24 --untied $SEED \
    --cache "$W/blind/calibration_cache.jsonl" --confirm 2 --out "$W/seed" --json > "$OUT/seed.log" 2>&1
  echo "seed exit $? at $(( $(date +%s) - START )) s" | tee -a "$OUT/seed.log"
  tar czf "$OUT/seed.tgz" -C "$W" seed
fi
