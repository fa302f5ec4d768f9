#!/usr/bin/env bash
# Device call E: the remaining model-mode runs, most decisive first, all inside ~550 s.
#   1. parity control: torch.compile, fusedce, an unrounded-logits torch loss and liger in one
#      200-step run (the seed-0 settings of examples/model/parity): is fusedce's mid-run gap
#      to torch bf16 trajectory sensitivity (the controls stray as far) or its own?
#   2. --eval-step rows for the fused back-ends at B=32 (an eval pass over full logits first).
#   3. --fit 24 for torch and fusedce (the search starts at each one's predicted batch).
#   4. the model-mode GPU tests, the --fit test first (the CUDA memory-cap fix).
#   5. a second seed, torch vs fusedce (+ the unrounded control), if time is left.
# Each step runs under `timeout`, capped by what is left of the script's budget; every
# command writes its folder as it goes (parity after each back-end, model rows and fit
# searches one by one), and the folders are tarred after each step, so a cut step keeps
# what it measured. Files in $OUT: nvidia-smi.txt, e_model.log and up to five .tgz.
. benchmarks/device/common.sh
BUDGET=${BUDGET:-550}   # seconds for the whole script, common.sh included
TAR_MARGIN=15           # kept back at each step for tarring and the log
LOG="$OUT/e_model.log"

# step NAME LIMIT CMD...: run CMD under timeout min(LIMIT, time left - TAR_MARGIN); log its time.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - SECONDS - TAR_MARGIN ))
  if (( left < limit )); then limit=$left; fi
  if (( limit < 20 )); then
    echo "== $name: skipped, ${left} s left" | tee -a "$LOG"
    return 0
  fi
  echo "== $name: start at ${SECONDS} s, limit ${limit} s: $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -25
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $(( SECONDS - start )) s (124: cut by the limit)" | tee -a "$LOG"
}

CONTROL=profiler.model.losses:unrounded_logits_loss
PARITY=(python3 -m fusedce_cli parity --preset user-gpt --steps 200 --batch 16 --seq 512 --lr 1e-3)
MODEL=(python3 -m fusedce_cli model --preset user-gpt --untied --batch 32 --seq 1024)

step parity-control 150 "${PARITY[@]}" --backend torch-compile --backend fusedce --backend "$CONTROL" \
  --backend liger --out /tmp/parity-control
tar czf "$OUT/parity-control.tgz" -C /tmp parity-control 2>/dev/null

step model-eval 160 "${MODEL[@]}" --backend torch --backend fusedce --backend liger --eval-step --out /tmp/model-eval-b32
tar czf "$OUT/model-eval-b32.tgz" -C /tmp model-eval-b32 2>/dev/null

step model-fit24 140 "${MODEL[@]}" --backend torch --backend fusedce --fit 24 --fit-max 96 --out /tmp/model-fit24
tar czf "$OUT/model-fit24.tgz" -C /tmp model-fit24 2>/dev/null

mkdir -p /tmp/gpu-tests
step gpu-tests 110 python3 -m pytest -q -rfE -p no:cacheprovider --junitxml=/tmp/gpu-tests/model_gpu.xml \
  tests/test_model_gpu.py::test_fit_under_a_cap_finds_a_batch_that_runs_and_one_that_does_not \
  tests/test_model_gpu.py::test_evaluation_pass_raises_reserved_not_allocated \
  tests/test_model_gpu.py::test_cuda_breakdown_sums_to_the_peak_and_device_figures_are_ordered
tar czf "$OUT/gpu-tests.tgz" -C /tmp gpu-tests 2>/dev/null

step parity-seed1 120 "${PARITY[@]}" --seed 1 --backend fusedce --backend "$CONTROL" --out /tmp/parity-seed1
[ -d /tmp/parity-seed1 ] && tar czf "$OUT/parity-seed1.tgz" -C /tmp parity-seed1
echo "== done at ${SECONDS} s" | tee -a "$LOG"
