#!/usr/bin/env bash
# The GPU tests of fusedce's frontier points (each strategy and budget against eager's error,
# bitwise determinism, torch.compile of the precompute op); about a minute on an H200.
#   bash benchmarks/device/frontier_tests.sh
. benchmarks/device/common.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fusedce_gpu.py \
  -k "strateg or precompute" --junitxml "$OUT/frontier-tests.xml" 2>&1 | tail -15
