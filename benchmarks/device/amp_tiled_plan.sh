#!/usr/bin/env bash
# benchmarks/amp_tiled_plan_ab.py (the tiled plan under autocast against the previous rule), then the GPU suite;
# raw results in $OUT. Usage on the device, from the repository root: bash benchmarks/device/amp_tiled_plan.sh
source "$(dirname "$0")/common.sh"
timeout 120 python3 benchmarks/amp_tiled_plan_ab.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/amp-tiled-plan-ab.log"
ab=${PIPESTATUS[0]}
mapfile -t FILES < <(grep -lE "needs (a )?CUDA|mark\.gpu|pytest\.mark\.gpu" tests/test_*.py)
FILES+=(tests/test_fusedce_tiles.py)
timeout -s INT 400 python3 -m pytest -q -p no:cacheprovider -rs --junitxml="$OUT/gpu-tests.xml" "${FILES[@]}" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -15
suite=${PIPESTATUS[0]}
[ "$ab" = 0 ] && [ "$suite" = 0 ]
