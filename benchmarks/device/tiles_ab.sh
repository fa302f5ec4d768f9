#!/usr/bin/env bash
# fusedce's default with and without the tiled kernels (benchmarks/tiles_ab.py), raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/tiles_ab.sh
source "$(dirname "$0")/common.sh"
python3 benchmarks/tiles_ab.py --out "$OUT" "$@" 2>&1 | tee "$OUT/tiles-ab.log"
exit "${PIPESTATUS[0]}"
