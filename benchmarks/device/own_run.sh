#!/usr/bin/env bash
# Device run "own run" (one H200, ~5 minutes): the user's own training step recorded where it runs,
# and doctor on a planted-bug set on the GPU under bf16 autocast.
#   1. Lightning Trainer.fit, precision bf16-mixed, of the seed's GPT (user-gpt: 12 layers, H=768,
#      V=32777), B=32×1024, 6 steps, a sanity check and a validation pass after step 3 (full
#      logits); fusedce_profile's StepRecorderCallback records steps 2 and 5 — naive loss, then the
#      fused loss (its own process, appended to the same folder: the report compares them)
#   2. doctor (run_doctor, amp-bf16) on the built-in GPT untied and tied, the tests' wrapped-head
#      model with a bias, and a ~1.1B Hugging Face Llama-like config (when transformers is there):
#      a correct wiring and each planted mistake; one JSON line per case
# Every step runs under `timeout`, capped by what is left of BUDGET; folders are tarred after each
# step, so a cut or failed step keeps what it measured. Files in $OUT (≤ 8): nvidia-smi.txt,
# own_run.log, environment.json, recorded.tgz, doctor.jsonl, doctor.tgz, snapshots.tgz (step 2's raw
# allocator snapshots, when under 60 MiB), table.md.
# Dry run on the CPU (tiny sizes, needs lightning for step 1): DRY=1 OUT=/tmp/dry bash benchmarks/device/own_run.sh
if [ "${DRY:-0}" = "1" ]; then
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$OUT"; echo "dry run: no GPU" > "$OUT/nvidia-smi.txt"
  PRESET=tiny; B=2; T=32; DB=4; DT=32; HF_SIZE=--tiny
else
  . benchmarks/device/common.sh
  PRESET=user-gpt; B=32; T=1024; DB=4; DT=64; HF_SIZE=
fi
BUDGET=${BUDGET:-330}
TAR_MARGIN=10
LOG="$OUT/own_run.log"
W=/tmp/own-run
rm -rf "$W"; mkdir -p "$W/recorded" "$W/doctor"

. benchmarks/device/steps.sh
# The raw allocator snapshots (*.pickle, for PyTorch's viewer) stay out of the tars: the report
# draws from their timeline JSON; step 2's go to snapshots.tgz at the end when they are small enough.
pack() { tar czf "$OUT/$1.tgz" --exclude='*.pickle' -C "$W" "$1" 2>/dev/null; }

timeout 60 python3 -m fusedce_cli env --json > "$OUT/environment.json" 2>>"$LOG"
for pkg in lightning transformers; do
  python3 -c "import $pkg; print('$pkg', $pkg.__version__)" 2>/dev/null | tee -a "$LOG" \
    || echo "$pkg: not installed (its step is skipped)" | tee -a "$LOG"
done
H=benchmarks/device/own_run.py
FIT=(python3 "$H" fit --preset "$PRESET" --batch "$B" --seq "$T" --steps 2 5 --max-steps 6 --validate-every 3
     --precision bf16-mixed --out "$W/recorded/user-gpt")
step fit-naive 110 "${FIT[@]}" --loss naive
pack recorded
step fit-fused 110 "${FIT[@]}" --loss fused --append
step report 30 python3 -m fusedce_cli report "$W/recorded/user-gpt"
pack recorded
HF=()
if python3 -c "import transformers" 2>/dev/null; then
  timeout 60 python3 benchmarks/device/model_diagnosis.py configs "$W/configs" $HF_SIZE >>"$LOG" 2>&1
  HF=(--hf "$W/configs/llama-1b.json")
fi
step doctor 150 python3 "$H" doctor --preset "$PRESET" --batch "$DB" --seq "$DT" --jsonl "$W/doctor.jsonl" \
  --folders "$W/doctor" "${HF[@]}"
cp "$W/doctor.jsonl" "$OUT/doctor.jsonl" 2>/dev/null
pack doctor
PICKLES=$(cd "$W" && ls recorded/user-gpt/snapshots/step-2-*.pickle 2>/dev/null)
if [ -n "$PICKLES" ] && (( $(cd "$W" && du -cm $PICKLES | tail -1 | cut -f1) < 60 )); then
  tar czf "$OUT/snapshots.tgz" -C "$W" $PICKLES
else
  echo "snapshots: step 2's raw snapshots not kept (${PICKLES:+over 60 MiB}${PICKLES:-none written})" | tee -a "$LOG"
fi
echo "== done at ${SECONDS} s" | tee -a "$LOG"
cd "$OUT" && timeout 60 python3 "$OLDPWD/$H" table "$W/recorded/user-gpt" "$W/doctor.jsonl" 2>>"$LOG"
