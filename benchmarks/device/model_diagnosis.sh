#!/usr/bin/env bash
# Device run "model diagnosis" (one H200, ~8 minutes): the seed's model and two HF-shaped models with
# the measured attribution and the logits detector, and `explain` on the user's 22785 → 22155 MiB.
#   1. explain: user-gpt, 22785 / 22155 MiB on a 24 GiB card (T in {1024, 2048}; calibrated at B = 2, 4;
#      the 2 closest hypotheses confirmed at full size)
#   2. user-gpt, untied, SDPA, B=32×1024 (~22 GiB torch step): torch, torch-compile, fusedce, liger
#   3. user-gpt, untied, eager attention, B=12×1024: torch, fusedce
#   4. user-gpt, tied, SDPA, B=32×1024: torch, fusedce
#   5. HF ~1.1B Llama-like (untied), 8×1024: torch, torch-compile, fusedce, liger, liger-patched
#   6. HF ~0.5B Qwen2-like (tied, V=151936), 8×1024: the same five
#   7. the user-module example (examples/user_model.py: wrapped head, tie on the wrapper) at 8×1024:
#      torch, fusedce and its loss wrapper that materialises the logits (the detector must flag it)
# Every step runs under `timeout`, capped by what is left of BUDGET; every command writes its folder
# row by row, folders are tarred after each step, so a cut or failed step keeps what it measured and
# the next step still runs. Files in $OUT (≤ 8): nvidia-smi.txt, model_diagnosis.log, explain.tgz,
# user-gpt.tgz, hf.tgz, table.md.
# Dry run on the CPU (tiny sizes, ~4 minutes on 2 cores): DRY=1 OUT=/tmp/dry bash benchmarks/device/model_diagnosis.sh
if [ "${DRY:-0}" = "1" ]; then
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$OUT"; echo "dry run: no GPU" > "$OUT/nvidia-smi.txt"
  DEV=cpu; PRESET=tiny; B=4; BE=2; T=64; HB=2; HT=32; SEQS=32,64; CAL=1,2; NAIVE=3.2; FUSED=2.9; CARD=24
  CONFIG_FLAG=--tiny
else
  . benchmarks/device/common.sh
  DEV=cuda; PRESET=user-gpt; B=32; BE=12; T=1024; HB=8; HT=1024; SEQS=1024,2048; CAL=2,4
  NAIVE=22785; FUSED=22155; CARD=24; CONFIG_FLAG=
fi
SEQS=${SEQ_CANDIDATES:-$SEQS}
BUDGET=${BUDGET:-470}
TAR_MARGIN=10
LOG="$OUT/model_diagnosis.log"
W=/tmp/model-diagnosis
rm -rf "$W"; mkdir -p "$W/user-gpt" "$W/hf"

# STEPS="explain hf-llama" runs only the named steps (see steps.sh).
. benchmarks/device/steps.sh
pack() { tar czf "$OUT/$1.tgz" -C "$W" "$1" 2>/dev/null; }

# liger and liger-patched rows need liger-kernel: the carried wheels (.whl/, installed by common.sh)
# on the device; without them those rows read "skipped: not installed", and the log says so first.
if python3 -c "import liger_kernel" 2>/dev/null; then
  echo "liger-kernel: $(python3 -c 'from importlib.metadata import version; print(version("liger-kernel"))' \
    2>/dev/null || echo 'version unknown') (from $(python3 -c 'import liger_kernel, os; print(os.path.dirname(liger_kernel.__file__))'))" | tee -a "$LOG"
else
  echo "liger-kernel: MISSING (no .whl/liger_kernel-*.whl carried): the liger and liger-patched rows will be skipped" \
    | tee -a "$LOG"
fi
timeout 60 python3 benchmarks/device/model_diagnosis.py configs "$W/configs" $CONFIG_FLAG >>"$LOG" 2>&1
M=(python3 -m fusedce_cli model --device "$DEV" --force)
FIVE=(--backend torch --backend torch-compile --backend fusedce --backend liger --backend liger-patched)

step explain 200 python3 -m fusedce_cli explain --device "$DEV" --preset "$PRESET" --naive "$NAIVE" --fused "$FUSED" \
  --card "$CARD" --seq-candidates "$SEQS" --calibration-batches "$CAL" --confirm 2 --out "$W/explain" --force
pack explain
step user-sdpa 100 "${M[@]}" --preset "$PRESET" --untied --batch "$B" --seq "$T" --attention sdpa \
  --backend torch --backend torch-compile --backend fusedce --backend liger --out "$W/user-gpt/sdpa-untied"
pack user-gpt
step user-eager 60 "${M[@]}" --preset "$PRESET" --untied --batch "$BE" --seq "$T" --attention eager \
  --backend torch --backend fusedce --out "$W/user-gpt/eager-untied"
pack user-gpt
step user-tied 60 "${M[@]}" --preset "$PRESET" --tied --batch "$B" --seq "$T" --attention sdpa \
  --backend torch --backend fusedce --out "$W/user-gpt/sdpa-tied"
pack user-gpt
step hf-llama 100 "${M[@]}" --hf "$W/configs/llama-1b.json" --batch "$HB" --seq "$HT" "${FIVE[@]}" --out "$W/hf/llama-1b"
pack hf
step hf-qwen2 100 "${M[@]}" --hf "$W/configs/qwen2-0.5b.json" --batch "$HB" --seq "$HT" "${FIVE[@]}" --out "$W/hf/qwen2-0.5b"
pack hf
step user-module 60 "${M[@]}" --model examples.user_model:build --preset "$PRESET" --batch "$HB" --seq "$HT" \
  --backend torch --backend fusedce --backend examples.user_model:wrapper_that_materialises --out "$W/user-gpt/user-module"
pack user-gpt
echo "== done at ${SECONDS} s" | tee -a "$LOG"
cd "$OUT" && timeout 60 python3 "$OLDPWD/benchmarks/device/model_diagnosis.py" table "$W/explain" "$W/user-gpt/sdpa-untied" \
  "$W/user-gpt/eager-untied" "$W/user-gpt/sdpa-tied" "$W/hf/llama-1b" "$W/hf/qwen2-0.5b" "$W/user-gpt/user-module" 2>>"$LOG"
