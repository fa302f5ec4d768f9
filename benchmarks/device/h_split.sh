#!/usr/bin/env bash
# Device call H: split-K for the precompute strategy's grad_hidden product; per-GEMM times.
. benchmarks/device/common.sh
timeout 120 python3 benchmarks/kernel_breakdown.py --out "$OUT/user" --rows 8192x768x32777 \
  --strategies recompute precompute 2>&1 | grep -v -i warn | tail -30
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fusedce_gpu.py -k "strateg or memory_model" \
  --junitxml="$OUT/gpu_tests_strategies.xml" 2>&1 | tail -4
