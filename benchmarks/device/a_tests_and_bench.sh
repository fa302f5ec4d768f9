#!/usr/bin/env bash
# Device call A: the GPU test suite, then the side-by-side benchmark (ANCHORS protocol).
. benchmarks/device/common.sh
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/ --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
timeout 330 python3 benchmarks/bench_lce.py --out "$OUT" 2>&1 | tail -60
