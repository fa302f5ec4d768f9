#!/usr/bin/env bash
# Device call F: the two strategies (recompute / precompute) — fusedce GPU tests, then the
# per-kernel time breakdown at the user's head and the Llama head.
. benchmarks/device/common.sh
timeout 240 python3 -m pytest -q -x -m gpu -p no:cacheprovider -rfE tests/test_fusedce_gpu.py \
  --junitxml="$OUT/gpu_tests_fusedce.xml" 2>&1 | tail -15
timeout 60 python3 benchmarks/kernel_breakdown.py --out "$OUT/user" --rows 8192x768x32777 \
  --strategies recompute precompute 2>&1 | tail -8
timeout 90 python3 benchmarks/kernel_breakdown.py --out "$OUT/llama" --rows 8192x4096x128256 \
  --strategies recompute 2>&1 | tail -8
