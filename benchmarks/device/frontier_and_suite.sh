#!/usr/bin/env bash
# One device call of at most ~590 s: (a) the whole frontier (benchmarks/device/frontier.sh without its
# tests, FRONTIER_BUDGET_S=230), (b) fusedce's default and "fast" at the Llama-3 head in pure bf16 split by
# kernel kind (benchmarks/kernel_breakdown.py), then (c) the GPU suite (benchmarks/device/gpu_suite.sh) in the
# time left. $OUT: frontier/ (as frontier.sh writes it), breakdown/, gpu-tests.xml and .log.
#   on the device:  bash benchmarks/device/frontier_and_suite.sh        (carry .whl for liger and cce)
set -u
START=$SECONDS
ALL_OUT=$OUT
OUT="$ALL_OUT/frontier" TESTS=0 FRONTIER_BUDGET_S=${FRONTIER_BUDGET_S:-230} bash benchmarks/device/frontier.sh \
  > "$ALL_OUT/frontier-call.log" 2>&1
grep -E '^(==|   goal|[0-9]+ of)' "$ALL_OUT/frontier-call.log" | tail -80
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
timeout 60 python3 benchmarks/kernel_breakdown.py --out "$ALL_OUT/breakdown" --rows 8192x4096x128256 --modes bf16 \
  --budgets default fast 2>&1 | grep -v -i warn | tail -14
LEFT=$((585 - (SECONDS - START)))
echo "GPU suite: $LEFT s left"
OUT=$ALL_OUT timeout "$LEFT" bash benchmarks/device/gpu_suite.sh | tail -12
