#!/usr/bin/env bash
# benchmarks/amp_tiles_probe.py: the tiled kernels in the autocast backward, probed in one process; raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/amp_tiles_probe.sh
source "$(dirname "$0")/common.sh"
timeout 300 python3 benchmarks/amp_tiles_probe.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/amp-tiles-probe.log"
exit "${PIPESTATUS[0]}"
