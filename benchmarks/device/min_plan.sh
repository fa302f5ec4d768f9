#!/usr/bin/env bash
# "min" under the planner's rule against the rule before it (benchmarks/min_plan_ab.py, pure bf16 heads, one
# process), then the frontier's bf16 cases it changes with every peer beside them (benchmarks/frontier.py):
# Gemma-2's head and Llama-3's at 32768 tokens. $OUT: min-plan-ab.json/.log, frontier/.
#   on the device:  bash benchmarks/device/min_plan.sh        (carry .whl for liger and cce)
set -u
. benchmarks/device/common.sh
timeout 200 python3 benchmarks/min_plan_ab.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/min-plan-ab.log"
ab=${PIPESTATUS[0]}
mkdir -p "$OUT/frontier"
timeout "${FRONTIER_S:-330}" python3 benchmarks/frontier.py --out "$OUT/frontier" --repeats 5 --budget-s 280 \
  --mode bf16 --cases "Gemma-2-2B" "Llama-3-8B, 32k tokens" \
  --impls fusedce torch_compile fusedce_fast fusedce_min liger cce torch 2>&1 | tee "$OUT/frontier/frontier.log" \
  | grep -E '^(==|   goal)'
frontier=${PIPESTATUS[0]}
echo "ab=$ab frontier=$frontier"
[ "$ab" = 0 ] && [ "$frontier" = 0 ]
