#!/usr/bin/env bash
# Two planner questions for the tiled kernels (benchmarks/plan_probe.py), raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/plan_probe.sh
source "$(dirname "$0")/common.sh"
python3 benchmarks/plan_probe.py --out "$OUT" "$@" 2>&1 | tee "$OUT/plan-probe.log"
exit "${PIPESTATUS[0]}"
