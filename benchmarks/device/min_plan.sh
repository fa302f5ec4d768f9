#!/usr/bin/env bash
# "min" under the planner's rule against the rule before it, Liger and cut-cross-entropy beside them
# (benchmarks/min_plan_ab.py, pure bf16 heads, one process), then the GPU suite without the benchmark
# adapters' tests (gpu_suite.sh: the planner's and the recorder's GPU tests). $OUT: min-plan-ab.json/.log,
# gpu-tests.xml/.log.   on the device:  bash benchmarks/device/min_plan.sh        (carry .whl)
set -u
. benchmarks/device/common.sh
timeout 170 python3 benchmarks/min_plan_ab.py --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/min-plan-ab.log"
ab=${PIPESTATUS[0]}
mapfile -t FILES < <(grep -lE "needs (a )?CUDA|mark\.gpu|pytest\.mark\.gpu" tests/test_*.py | grep -v test_benchmarks_impls)
timeout -s INT "${SUITE_S:-400}" bash benchmarks/device/gpu_suite.sh "${FILES[@]}" tests/test_fusedce_tiles.py
suite=$?
echo "ab=$ab suite=$suite"
[ "$ab" = 0 ] && [ "$suite" = 0 ]
