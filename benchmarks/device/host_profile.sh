#!/usr/bin/env bash
# Where a host-bound step's host time goes (benchmarks/host_profile.py), raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/host_profile.sh
source "$(dirname "$0")/common.sh"
python3 benchmarks/host_profile.py --out "$OUT/host-profile.json" "$@" 2>&1 | grep -v Warning | tee "$OUT/host-profile.log"
exit "${PIPESTATUS[0]}"
