#!/usr/bin/env bash
# The causes of two frontier findings (benchmarks/NOTES.md, design 23), one call, raw results in $OUT:
# - fusedce's grad_h error at the soft-capped Gemma-2 head in amp above eager's: the strategy (recompute against
#   precompute) or the vocabulary blocks of grad_h's fp32 sum. fusedce_fast_recompute has "fast"'s blocks and
#   recomputes; fusedce_precompute has the default's blocks and precomputes. Strategy: the first at the default's
#   error, the second at eager's. Blocks: the reverse.
# - "fast" against the default at the user's head: the GPU's kernels per step of each plan, amp and bf16 (in amp
#   "fast"'s device time was 1.1 ms lower, which the time model does not predict).
# Usage on the device, from the repository root: SEEDS="0 1" bash benchmarks/device/frontier_causes.sh
source "$(dirname "$0")/common.sh"
python3 benchmarks/kernel_breakdown.py --out "$OUT/kernels" --rows 8192x768x32777 --budgets default fast \
  2>&1 | grep -v Warning | tee "$OUT/kernels.log"
for seed in ${SEEDS:-0 1}; do
  python3 benchmarks/frontier.py --out "/tmp/softcap-seed$seed" --seed "$seed" --repeats 5 --budget-s 200 \
    --impls fusedce fusedce_fast fusedce_precompute fusedce_fast_recompute torch --cases "Gemma-2-2B, soft-cap 30" \
    --mode amp > "$OUT/softcap-strategy-seed$seed.log" 2>&1
  cp "/tmp/softcap-seed$seed/frontier.jsonl" "$OUT/softcap-strategy-seed$seed.jsonl"
  cp "/tmp/softcap-seed$seed/environment.json" "$OUT/environment.json"
  grep -E "x256000" "$OUT/softcap-strategy-seed$seed.log" | head -8
done
