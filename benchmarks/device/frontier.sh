#!/usr/bin/env bash
# The fused loss on the time–memory frontier, on the H200, in one call: (a) the loss's GPU tests
# (tests/test_fusedce_gpu.py and test_fusedce_tiles.py, ≤ 150 s), then (b) benchmarks/frontier.py — every ANCHORS row in amp
# and bf16 (then the extra heads while time is left) with torch.compile, Liger, cce, eager torch and
# fusedce's default, "fast" and "min" in one process; each case prints who dominates whom and
# goals 1–5. Cases left after FRONTIER_BUDGET_S (default 270 s) are recorded as skipped; hard limits
# keep the whole call under 8.5 minutes.
#   on the device:  bash benchmarks/device/frontier.sh        (carry .whl for liger and cce)
#   on the CPU:     DRY=1 OUT=/tmp/frontier-dry bash benchmarks/device/frontier.sh
# $OUT: gpu-tests.xml, frontier.jsonl (raw cells and per-case goals), frontier.json/.md,
# environment.json, frontier.log, frontier.png (benchmarks/frontier_plot.py), nvidia-smi.txt (device only).
# TESTS=0 skips (a) (after the GPU suite in the same session); FRONTIER_BUDGET_S=480 with it fills one call;
# IMPLS="..." names other points (for example with fusedce_fast_recompute); CASES="user Llama-3-8B" only those labels.
set -u
export PYTHONUNBUFFERED=1
IMPLS=${IMPLS:-"fusedce torch_compile fusedce_fast fusedce_min liger cce torch"}
if [ "${DRY:-0}" = "1" ]; then
  mkdir -p "$OUT"
  PY=${PYTHON:-python3}
  timeout 470 "$PY" benchmarks/frontier.py --dry --repeats 1 --budget-s 300 --out "$OUT" \
    --impls ${IMPLS/ cce/} 2>&1 | tee "$OUT/frontier.log"
  exit "${PIPESTATUS[0]}"
fi
. benchmarks/device/common.sh
if [ "${TESTS:-1}" != "0" ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fusedce_gpu.py tests/test_fusedce_tiles.py \
    --junitxml "$OUT/gpu-tests.xml" 2>&1 | tail -6
fi
BUDGET_S=${FRONTIER_BUDGET_S:-270}
timeout $((BUDGET_S + 60)) python3 benchmarks/frontier.py --out "$OUT" --repeats 5 --budget-s "$BUDGET_S" \
  --impls $IMPLS ${CASES:+--cases $CASES} 2>&1 | tee "$OUT/frontier.log"
status=${PIPESTATUS[0]}
python3 benchmarks/frontier_plot.py "$OUT/frontier.jsonl" -o "$OUT/frontier.png" 2>&1 | tail -1
grep -o 'testsuite [^>]*' "$OUT/gpu-tests.xml" 2>/dev/null | head -1
grep -E '^(==|   goal)' "$OUT/frontier.log"
exit "$status"
