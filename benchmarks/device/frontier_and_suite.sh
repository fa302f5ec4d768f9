#!/usr/bin/env bash
# One device call of at most CALL_S (default 585) seconds: (a) the GPU suite (benchmarks/device/gpu_suite.sh,
# at most SUITE_S = 380 s), (b) the whole frontier (benchmarks/device/frontier.sh without its tests) in the
# time left less 140 s (with fusedce_x1_25: the default's memory goal asked for by name), then (c) fusedce's
# default and "fast" at the Llama-3 head in pure bf16 split by kernel kind (benchmarks/kernel_breakdown.py).
# $OUT: gpu-tests.xml and .log, frontier/ (as frontier.sh writes it), frontier-call.log, breakdown/.
#   on the device:  bash benchmarks/device/frontier_and_suite.sh        (carry .whl for liger and cce)
set -u
START=$SECONDS
CALL_S=${CALL_S:-585}
left() { echo $((CALL_S - (SECONDS - START))); }
# SUITE_FILES="tests/a.py tests/b.py": only those test files (the suite split over two calls);
# FRONTIER_IMPLS="...": the frontier's points (default: the seven below and fusedce_x1_25).
timeout "${SUITE_S:-380}" bash benchmarks/device/gpu_suite.sh ${SUITE_FILES:-} | tail -8
BUDGET=$(($(left) - ${RESERVE_S:-140}))  # RESERVE_S=60: no time kept for (c)
if [ "$BUDGET" -gt 60 ]; then
  echo "frontier: $BUDGET s of budget"
  ALL_OUT=$OUT
  IMPLS=${FRONTIER_IMPLS:-"fusedce torch_compile fusedce_fast fusedce_min fusedce_x1_25 liger cce torch"} \
    OUT="$ALL_OUT/frontier" TESTS=0 FRONTIER_BUDGET_S=$BUDGET bash benchmarks/device/frontier.sh \
    > "$ALL_OUT/frontier-call.log" 2>&1
  grep -E '^(==|   goal|[0-9]+ of)' "$ALL_OUT/frontier-call.log" | tail -80
  OUT=$ALL_OUT
fi
if [ "$(left)" -gt 50 ]; then
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  timeout $(($(left) - 5)) python3 benchmarks/kernel_breakdown.py --out "$OUT/breakdown" --rows 8192x4096x128256 \
    --modes bf16 --budgets default fast 2>&1 | grep -v -i warn | tail -14
fi
