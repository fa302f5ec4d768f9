#!/usr/bin/env bash
# Device call G: after aligning the logits block's row stride and moving lse into the
# statistics kernel — strategy tests, the breakdown at the user's head, and the side-by-side
# benchmark at that row through the profiler's back-end registry (liger/cce adapters).
. benchmarks/device/common.sh
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fusedce_gpu.py -k "strateg or memory_model" \
  --junitxml="$OUT/gpu_tests_strategies.xml" 2>&1 | tail -6
timeout 60 python3 benchmarks/kernel_breakdown.py --out "$OUT/user" --rows 8192x768x32777 \
  --strategies recompute precompute 2>&1 | grep -v Warn | tail -5
timeout 150 python3 benchmarks/bench_lce.py --rows 8192x768x32777 --out "$OUT/bench-user" 2>&1 | tail -20
