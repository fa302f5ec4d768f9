#!/usr/bin/env bash
# Device call J: the final side-by-side benchmark (goals 1-3) and the all-options variant
# (goal 4) after aligning ragged GEMM dimensions; a few GPU tests; the user-head breakdown.
. benchmarks/device/common.sh
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fusedce_gpu.py \
  -k "users_head or memory_model or zero_tokens or bitwise" --junitxml="$OUT/gpu_tests_fusedce.xml" 2>&1 | tail -4
timeout 40 python3 benchmarks/kernel_breakdown.py --out "$OUT/breakdown" --rows 8192x768x32777 2>&1 | grep -v -i warn | tail -12
timeout 210 python3 benchmarks/bench_lce.py --out "$OUT/bench" --tag aligned 2>&1 | tail -42
timeout 110 python3 benchmarks/bench_lce.py --out "$OUT/bench" --all-options --tag aligned-all-options \
  --impls torch torch_compile fusedce liger 2>&1 | tail -22
