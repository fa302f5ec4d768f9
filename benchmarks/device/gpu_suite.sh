#!/usr/bin/env bash
# The GPU-only tests (those skipped on a machine without CUDA), with their counts in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/gpu_suite.sh [PYTEST ARGS]
# (default: every test file that holds a CUDA-only test, and the tiled kernels' tests).
source "$(dirname "$0")/common.sh"
FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
  mapfile -t FILES < <(grep -lE "needs (a )?CUDA|mark\.gpu|pytest\.mark\.gpu" tests/test_*.py)
  FILES+=(tests/test_fusedce_tiles.py)  # interpreted on the CPU, compiled here
fi
python3 -m pytest -q -p no:cacheprovider -rs --junitxml="$OUT/gpu-tests.xml" "${FILES[@]}" 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
exit "${PIPESTATUS[0]}"
