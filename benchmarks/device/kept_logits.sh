#!/usr/bin/env bash
# Logits kept from the forward (fusedce/kept_plan.py), on the device, in one call: (a) the bf16 frontier
# of the Llama-3 and Mistral-NeMo heads with "fast" beside "fast" recomputing by name (the plan before
# logits were kept: nothing held from the forward, wide blocks) and its peers, in one process; (b) the
# loss's GPU test files (parity with eager, determinism, the memory model's peak), the kept logits' own
# tests compiled, and the logits detector's.
# SHORT=1 (about three minutes of device time): only "fast", "fast" recomputing, torch.compile and Liger,
# and only the kept logits' tests and the memory model's.
# FRONTIER_ONLY=1: (a) alone. SUITE=1: the whole GPU suite (benchmarks/device/gpu_suite.sh, ≤ SUITE_S=400 s) in place of (b).
#   on the device:  bash benchmarks/device/kept_logits.sh        (carry .whl for liger)
# $OUT: frontier-bf16/ (frontier.jsonl, .json, .md, environment.json), frontier-bf16.log, gpu-tests.xml.
set -u
export PYTHONUNBUFFERED=1
. benchmarks/device/common.sh
if [ "${SHORT:-0}" = "1" ]; then
  IMPLS=(fusedce_fast fusedce_fast_recompute torch_compile liger); TESTS=(-k "kept or memory_model or once")
  FILES=(tests/test_fusedce_kept.py tests/test_fusedce_gpu.py); LIMITS=(90 80)
else
  IMPLS=(fusedce torch_compile fusedce_fast fusedce_fast_recompute fusedce_min liger); TESTS=()
  FILES=(tests/test_fusedce_kept.py tests/test_fusedce_gpu.py tests/test_fusedce_tiles.py tests/test_trace.py)
  LIMITS=(130 250)
fi
timeout "${LIMITS[0]}" python3 benchmarks/frontier.py --out "$OUT/frontier-bf16" --mode bf16 --repeats 5 \
  --budget-s $((LIMITS[0] - 10)) --cases Llama-3-8B "Mistral-NeMo, bias" --impls "${IMPLS[@]}" 2>&1 \
  | tee "$OUT/frontier-bf16.log" | grep -E '^(==|   )'
[ "${FRONTIER_ONLY:-0}" = "1" ] && exit 0
if [ "${SUITE:-0}" = "1" ]; then
  timeout "${SUITE_S:-400}" bash benchmarks/device/gpu_suite.sh | tail -12
  exit "${PIPESTATUS[0]}"
fi
timeout "${LIMITS[1]}" python3 -m pytest -q -p no:cacheprovider -rf "${FILES[@]}" "${TESTS[@]}" \
  --junitxml "$OUT/gpu-tests.xml" 2>&1 | tail -12
