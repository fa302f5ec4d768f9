#!/usr/bin/env bash
# The fused-epilogue experiment (benchmarks/fused_epilogue_probe.py) at three heads, raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/fused_epilogue.sh
source "$(dirname "$0")/common.sh"
python3 benchmarks/fused_epilogue_probe.py --out "$OUT" "$@" 2>&1 | tee "$OUT/fused-epilogue.log"
exit "${PIPESTATUS[0]}"
