#!/usr/bin/env bash
# Device call I: ragged GEMM dimensions split into an aligned product + a thin tail. The
# breakdown at the user's head; the fusedce GPU tests; then, if precompute now beats
# recompute there, the full side-by-side benchmark (goals 1-3) and the all-options variant.
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/kernel_breakdown.py --out "$OUT/user" --rows 8192x768x32777 \
  --strategies recompute precompute 2>&1 | grep -v -i warn | tail -24
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_fusedce_gpu.py tests/test_benchmarks_impls.py \
  --junitxml="$OUT/gpu_tests_fusedce.xml" 2>&1 | tail -5
if python3 - "$OUT/user/kernel-breakdown.json" <<'PY'
import json, sys
rows = {(r["mode"], r["strategy"]): r.get("median_ms", 1e9) for r in json.load(open(sys.argv[1]))["results"]}
sys.exit(0 if rows[("amp-bf16", "precompute")] < rows[("amp-bf16", "recompute")] else 1)
PY
then
  timeout 200 python3 benchmarks/bench_lce.py --out "$OUT/bench" --tag precompute 2>&1 | tail -42
  timeout 110 python3 benchmarks/bench_lce.py --out "$OUT/bench" --all-options --tag precompute-all-options \
    --impls torch torch_compile fusedce liger 2>&1 | tail -22
fi
