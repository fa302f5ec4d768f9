#!/usr/bin/env bash
# The tiled plan checked on the H200 in one call: the pure-bf16 rows of the frontier (every
# implementation in one process), then the GPU tests of the code it changed (the loss, its
# strategies and memory model, the profiler's prediction). Raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/tiled_plan.sh  (carry .whl)
source "$(dirname "$0")/common.sh"
timeout 200 python3 benchmarks/frontier.py --out "$OUT" --repeats 5 --budget-s 150 --mode bf16 \
  --impls fusedce torch_compile fusedce_fast fusedce_min liger cce torch 2>&1 | tee "$OUT/frontier.log" \
  | grep -E '^(==|   goal|   fusedce|   liger)'
timeout -s INT "${SUITE_S:-370}" python3 -m pytest -q -p no:cacheprovider -rs --junitxml="$OUT/gpu-tests.xml" \
  tests/test_fusedce_gpu.py tests/test_fusedce_tiles.py tests/test_fusedce_strategies.py \
  tests/test_profiler_memory_model.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -8
