#!/usr/bin/env bash
# The loss's GPU tests of the tiled kernels, then benchmarks/autocast_forward_ab.py (the autocast forward in
# wide chunks against the block path; "fast" as planned against its recompute plan), raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/autocast_forward_ab.sh [--cases I ...]
source "$(dirname "$0")/common.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fusedce_tiles.py 2>&1 | tail -5 | tee "$OUT/tiles-tests.txt"
tests=${PIPESTATUS[0]}
timeout 380 python3 benchmarks/autocast_forward_ab.py --out "$OUT" "$@" 2>&1 | grep -v Warning | tee "$OUT/ab.log"
ab=${PIPESTATUS[0]}
[ "$tests" = 0 ] && [ "$ab" = 0 ]
