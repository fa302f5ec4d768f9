#!/usr/bin/env bash
# benchmarks/amp_tiled_plan_ab.py (the tiled plan under autocast against the previous rule), then the GPU
# suite (gpu_suite.sh); raw results in $OUT. Usage on the device, from the repository root:
#   bash benchmarks/device/amp_tiled_plan.sh
source "$(dirname "$0")/common.sh"
timeout 150 python3 benchmarks/amp_tiled_plan_ab.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/amp-tiled-plan-ab.log"
ab=${PIPESTATUS[0]}
timeout -s INT 420 bash "$(dirname "$0")/gpu_suite.sh"
suite=$?
[ "$ab" = 0 ] && [ "$suite" = 0 ]
