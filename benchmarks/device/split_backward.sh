#!/usr/bin/env bash
# The split backward in one call: benchmarks/split_backward_ab.py (split against one pass, pure bf16 heads),
# the GPU suite (gpu_suite.sh), then the frontier's bf16 cases with every peer (benchmarks/frontier.py
# --mode bf16); raw results in $OUT. Usage on the device, from the repository root (carry .whl):
#   bash benchmarks/device/split_backward.sh
source "$(dirname "$0")/common.sh"
timeout 110 python3 benchmarks/split_backward_ab.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/split-backward-ab.log"
ab=${PIPESTATUS[0]}
timeout -s INT 250 bash "$(dirname "$0")/gpu_suite.sh"
suite=$?
mkdir -p "$OUT/frontier"
timeout 180 python3 benchmarks/frontier.py --out "$OUT/frontier" --repeats 5 --budget-s 150 --mode bf16 \
  --impls fusedce torch_compile fusedce_fast fusedce_min liger cce torch 2>&1 | tee "$OUT/frontier/frontier.log" \
  | grep -E '^(==|   goal)'
frontier=${PIPESTATUS[0]}
echo "ab=$ab suite=$suite frontier=$frontier"
[ "$ab" = 0 ] && [ "$suite" = 0 ] && [ "$frontier" = 0 ]
